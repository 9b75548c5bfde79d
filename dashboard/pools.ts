// Pools: every pool with its live numbers (refreshed every second), and creating a pool.
import { api } from './api.js';
import { h, replace, BASE } from './dom.js';
import { field, input, select, formError, clearErrors, showError, type Field } from './forms.js';
import type { Pool, PoolLive } from './types.js';
import { navigate } from './router.js';

export const REFRESH_MS = 1000;

function usage(l: PoolLive): HTMLElement {
  const limit = l.effective_limit ?? l.max_concurrent;
  const pct = limit > 0 && l.in_flight !== null ? Math.min(100, Math.round((100 * l.in_flight) / limit)) : 0;
  const bar = h('span', { class: 'bar-fill' });
  bar.style.width = `${pct}%`;
  return h('span', { class: `bar${pct >= 90 ? ' hot' : ''}`, aria: { hidden: 'true' } }, bar);
}

const num = (n: number | null | undefined): string => (n === null || n === undefined ? '—' : String(n));

export function poolsPage(main: HTMLElement): () => void {
  const tbody = h('tbody');
  const updated = h('span', { class: 'muted' });
  const notice = h('p', { class: 'notice', role: 'status' });
  const table = h(
    'table',
    { class: 'data', id: 'pools-table' },
    h('caption', null, 'Live per pool; last minute counts. ', updated),
    h('thead', null, h('tr', null,
      h('th', { scope: 'col' }, 'Pool'), h('th', { scope: 'col' }, 'Backend'),
      h('th', { scope: 'col', class: 'n' }, 'In flight'), h('th', { scope: 'col', class: 'n' }, 'Queued'),
      h('th', { scope: 'col', class: 'n' }, 'Effective limit'), h('th', { scope: 'col', class: 'n' }, 'Max concurrent'),
      h('th', { scope: 'col', class: 'n' }, 'Admitted /min'), h('th', { scope: 'col', class: 'n' }, '429'),
      h('th', { scope: 'col', class: 'n' }, '504'), h('th', { scope: 'col', class: 'n' }, '5xx'))),
    tbody,
  );
  replace(main, h('div', { class: 'page-head' }, h('h1', null, 'Pools')), notice, h('div', { class: 'card' }, table), createPoolForm());

  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const tick = async () => {
    try {
      const { data } = await api<{ data: PoolLive[] }>('GET', '/api/v1/metrics/live');
      if (stopped) return;
      notice.textContent = data.some((p) => !p.reporting) ? 'No data plane runs in this control process: live numbers are not available here.' : '';
      replace(
        tbody,
        data.length === 0 ? h('tr', null, h('td', { class: 'empty', colspan: '10' }, 'No pools yet. Create one below.')) : null,
        data.map((p) =>
          h('tr', { data: { pool: p.subdomain } },
            h('th', { scope: 'row' }, h('a', { href: `${BASE}/pools/${encodeURIComponent(p.subdomain)}` }, p.name), h('div', { class: 'sub' }, p.subdomain)),
            h('td', null, h('span', { class: `badge ${p.backend}` }, p.backend)),
            h('td', { class: 'n', data: { field: 'in_flight' } }, num(p.in_flight), ' ', p.reporting ? usage(p) : null),
            h('td', { class: 'n', data: { field: 'queued' } }, num(p.queued)),
            h('td', { class: 'n', data: { field: 'effective_limit' } }, num(p.effective_limit)),
            h('td', { class: 'n', data: { field: 'max_concurrent' } }, String(p.max_concurrent)),
            h('td', { class: 'n' }, num(p.last_minute?.admitted)),
            h('td', { class: `n${p.last_minute?.status_429 ? ' warn' : ''}` }, num(p.last_minute?.status_429)),
            h('td', { class: `n${p.last_minute?.status_504 ? ' warn' : ''}` }, num(p.last_minute?.status_504)),
            h('td', { class: `n${p.last_minute?.status_5xx ? ' bad' : ''}` }, num(p.last_minute?.status_5xx)),
          ),
        ),
      );
      updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      notice.textContent = (err as Error).message;
    }
    if (!stopped) timer = setTimeout(tick, REFRESH_MS);
  };
  void tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

function createPoolForm(): HTMLElement {
  const kind = select('kind', [['http', 'HTTP origin'], ['database', 'Database (PostgreSQL or MySQL)']], 'http');
  const httpFields: Field[] = [
    field('Origin URL', input('origin', { placeholder: 'https://api.example.com', required: true }), 'The https origin this pool admits traffic to.'),
  ];
  const dbFields: Field[] = [
    field('Database host', input('db_host', { placeholder: 'db.example.com' })),
    field('Database port', input('db_port', { type: 'number', placeholder: '5432 or 3306' }), 'Port 3306 makes a MySQL pool; any other a PostgreSQL pool.'),
    field('Database name', input('db_name', { placeholder: 'app' })),
    field('TLS mode', select('db_sslmode', [['verify-full', 'verify-full'], ['require', 'require']], 'verify-full')),
  ];
  const name = field('Name (optional)', input('name', { placeholder: 'Derived from the host when empty' }));
  const err = formError();
  const httpBox = h('div', null, httpFields.map((f) => f.row));
  const dbBox = h('div', { class: 'hidden' }, dbFields.map((f) => f.row));
  const setKind = () => {
    const db = kind.value === 'database';
    httpBox.classList.toggle('hidden', db);
    dbBox.classList.toggle('hidden', !db);
    (httpFields[0]!.control as HTMLInputElement).required = !db;
    (dbFields[0]!.control as HTMLInputElement).required = db;
    (dbFields[2]!.control as HTMLInputElement).required = db;
  };
  kind.addEventListener('change', setKind);
  const form = h(
    'form',
    {
      class: 'card form',
      aria: { labelledby: 'create-pool-title' },
      onsubmit: async (ev) => {
        ev.preventDefault();
        const all = [...httpFields, ...dbFields, name];
        clearErrors(all, err);
        const v = (f: Field) => f.control.value.trim();
        try {
          let body: Record<string, unknown>;
          let path = '/api/v1/pools';
          if (kind.value === 'database') {
            path = '/api/v1/pools/database';
            body = { db_host: v(dbFields[0]!), db_name: v(dbFields[2]!), db_sslmode: v(dbFields[3]!) };
            if (v(dbFields[1]!)) body.db_port = Number(v(dbFields[1]!));
          } else {
            body = { origin: v(httpFields[0]!) };
          }
          if (v(name)) body.name = v(name);
          const { data } = await api<{ data: Pool }>('POST', path, body);
          navigate(`${BASE}/pools/${encodeURIComponent(data.subdomain)}`);
        } catch (e) {
          showError(e, all, err);
        }
      },
    },
    h('h2', { id: 'create-pool-title' }, 'Create a pool'),
    field('Kind', kind).row,
    httpBox,
    dbBox,
    name.row,
    err,
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'btn primary' }, 'Create pool')),
  );
  return form;
}
