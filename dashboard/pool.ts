// One pool: live numbers, settings (the API's validation errors beside the field), keys (mint, shown
// once, revoke), credential attach, and per-minute charts over the last hour or day.
import { api, ApiFailure } from './api.js';
import { h, replace, fmtTime, orDash, BASE } from './dom.js';
import { field, input, checkbox, select, formError, clearErrors, showError, shownOnce, type Field } from './forms.js';
import { minutesChart, POOL_CHARTS } from './charts.js';
import type { AdjustmentCause, Minute, Pool, PoolKey, PoolLimit, PoolLive, Settings, Webhook } from './types.js';
import { REFRESH_MS } from './pools.js';

const WINDOWS = { '1h': 3_600_000, '24h': 86_400_000 } as const;

export function poolPage(main: HTMLElement, subdomain: string): () => void {
  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const base = `/api/v1/pools/${encodeURIComponent(subdomain)}`;
  replace(main, h('p', { class: 'loading' }, 'Loading…'));

  void (async () => {
    let pool: Pool;
    try {
      pool = (await api<{ data: Pool }>('GET', base)).data;
    } catch (err) {
      replace(main, h('h1', null, 'Pool'), h('p', { class: 'form-error', role: 'alert' }, (err as Error).message), h('a', { href: `${BASE}/pools` }, 'Back to pools'));
      return;
    }
    const live = h('dl', { class: 'stats', id: 'pool-live' });
    const limit = h('div', { id: 'pool-limit' });
    const credState = h('span', { class: `badge ${pool.has_credential ? 'ok' : 'muted'}`, id: 'has-credential' }, pool.has_credential ? 'credential attached' : 'no credential');
    replace(
      main,
      h('nav', { class: 'crumbs', aria: { label: 'Breadcrumb' } }, h('a', { href: `${BASE}/pools` }, 'Pools'), ' / ', pool.subdomain),
      h('div', { class: 'page-head' }, h('h1', null, pool.name), h('span', { class: `badge ${pool.backend}` }, pool.backend), credState),
      pool.description ? h('p', { class: 'muted' }, pool.description) : null,
      h('section', { class: 'card', aria: { label: 'Live' } }, live, limit),
      await chartsSection(base),
      await keysSection(base),
      h('div', { class: 'grid2' }, await settingsSection(base), credentialSection(base, pool, (p) => {
        credState.textContent = p.has_credential ? 'credential attached' : 'no credential';
        credState.className = `badge ${p.has_credential ? 'ok' : 'muted'}`;
      })),
      await destinationsSection(base, pool),
    );
    const tick = async () => {
      try {
        const { data } = await api<{ data: PoolLive[] }>('GET', '/api/v1/metrics/live');
        const l = data.find((p) => p.subdomain === subdomain);
        if (l && !stopped) {
          const stat = (label: string, value: string, key: string) => [h('dt', null, label), h('dd', { data: { field: key } }, value)];
          const n = (v: number | null | undefined) => (v === null || v === undefined ? '—' : String(v));
          replace(live,
            stat('In flight', n(l.in_flight), 'in_flight'), stat('Queued', n(l.queued), 'queued'),
            stat('Effective limit', n(l.effective_limit), 'effective_limit'), stat('Max concurrent', String(l.max_concurrent), 'max_concurrent'),
            stat('Admitted /min', n(l.last_minute?.admitted), 'admitted'), stat('429 /min', n(l.last_minute?.status_429), 'status_429'),
            stat('504 /min', n(l.last_minute?.status_504), 'status_504'), stat('5xx /min', n(l.last_minute?.status_5xx), 'status_5xx'));
        }
        const why = (await api<{ data: PoolLimit }>('GET', `${base}/limit`)).data;
        if (!stopped) replace(limit, ...limitExplained(why));
      } catch {
        /* the next tick tries again */
      }
      if (!stopped) timer = setTimeout(tick, REFRESH_MS);
    };
    void tick();
  })();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

const CAUSES: Record<AdjustmentCause, string> = {
  latency_gradient: 'latency rose above its long-term level',
  growth: 'latency held while busy: grew',
  status_429: 'the upstream answered 429',
  throttled: 'a lock client reported throttling',
  rate_headers: 'the upstream\'s rate headers or Retry-After asked to slow down',
  probe: 'latency probe (lowered for a moment)',
  probe_end: 'latency probe over',
};

const ms = (v: number | null) => (v === null ? '—' : `${v >= 100 ? Math.round(v) : v} ms`);

/** Issue 26 item 4: why the effective limit is below max_concurrent, and the adaptive limit's last moves. */
function limitExplained(l: PoolLimit): Node[] {
  if (!l.reporting) return [h('p', { class: 'muted' }, 'No data plane runs in this process: the effective limit is not known here.')];
  const eff = l.effective_limit ?? l.max_concurrent;
  let why: string;
  if (!l.adaptive) why = 'Adaptive limiting is off: the limit is max concurrent.';
  else if (eff >= l.max_concurrent) why = `The adaptive limit is at max concurrent (it can go down to ${l.adaptive_min}).`;
  else {
    const last = l.adjustments[0];
    why = `The adaptive limit holds it at ${eff} of ${l.max_concurrent} (floor ${l.adaptive_min})` +
      (l.probing ? ': a latency probe is running.' : last ? `; last move: ${CAUSES[last.cause]}.` : '.') +
      ` Recent latency ${ms(l.short_rtt_ms)}, long-term ${ms(l.long_rtt_ms)}.`;
  }
  const out: Node[] = [h('p', { class: 'limit-why', data: { field: 'limit_why' } }, why)];
  if (l.adjustments.length > 0) {
    out.push(h('table', { class: 'adjustments' },
      h('caption', null, 'Last adjustments of the adaptive limit'),
      h('thead', null, h('tr', null, h('th', null, 'Time'), h('th', null, 'Limit'), h('th', null, 'Cause'), h('th', null, 'Latency (recent / long-term)'))),
      h('tbody', null, ...l.adjustments.map((a) => h('tr', { data: { cause: a.cause } },
        h('td', null, fmtTime(a.time)), h('td', null, `${a.from} → ${a.to}`), h('td', null, CAUSES[a.cause]),
        h('td', null, `${ms(a.short_rtt_ms)} / ${ms(a.long_rtt_ms)}`)))),
    ));
  }
  return out;
}

async function chartsSection(base: string): Promise<HTMLElement> {
  const holders = POOL_CHARTS.map((c) => h('div', { class: 'chart', id: c.id, role: 'img', aria: { label: c.title } }));
  const holder = h('div', { id: 'chart' }, holders);
  const summary = h('p', { class: 'muted', role: 'status' });
  const show = async (w: keyof typeof WINDOWS) => {
    try {
      const { data } = await api<{ data: Minute[] }>('GET', `${base}/metrics/minutes?window=${w}`);
      // Drawn once the section is on the page, at its width.
      while (!holder.isConnected) await new Promise((r) => requestAnimationFrame(r));
      const span = w === '1h' ? 'hour' : 'day';
      POOL_CHARTS.forEach((c, i) => {
        replace(holders[i]!);
        minutesChart(holders[i]!, data, WINDOWS[w], `${c.title}, last ${span}`, c.unit, c.series);
      });
      const sum = (k: keyof Minute) => data.reduce((a, r) => a + ((r[k] as number | null) ?? 0), 0);
      const worst = (k: keyof Minute) => data.reduce<number | null>((a, r) => (r[k] === null ? a : Math.max(a ?? 0, r[k] as number)), null);
      const ms = (v: number | null) => (v === null ? 'none' : `${v} ms`);
      // The charts' text equivalent for screen readers.
      summary.textContent = `Last ${span}: ${sum('requests')} requests, ${sum('admitted')} admitted, ${sum('queued')} queued, ${sum('rejected')} rejected, ` +
        `${sum('upstream_errors')} upstream errors; worst minute queue wait p95 ${ms(worst('queue_wait_p95_ms'))}, upstream p95 ${ms(worst('upstream_p95_ms'))}.`;
    } catch (err) {
      summary.textContent = (err as Error).message;
    }
  };
  const buttons = (Object.keys(WINDOWS) as (keyof typeof WINDOWS)[]).map((w) =>
    h('button', {
      type: 'button', class: 'btn small', aria: { pressed: w === '1h' ? 'true' : 'false' },
      onclick: (ev) => {
        for (const b of buttons) b.setAttribute('aria-pressed', String(b === ev.currentTarget));
        void show(w);
      },
    }, w === '1h' ? 'Last hour' : 'Last day'),
  );
  queueMicrotask(() => void show('1h'));
  return h('section', { class: 'card', aria: { labelledby: 'charts-title' } },
    h('div', { class: 'section-head' }, h('h2', { id: 'charts-title' }, 'Traffic'), h('div', { class: 'toggle', role: 'group', aria: { label: 'Time window' } }, buttons)),
    holder, summary);
}

const SETTING_FIELDS: Array<{ key: string; label: string; kind: 'int' | 'bool' | 'intOrNull'; hint?: string }> = [
  { key: 'queueTimeoutMs', label: 'Queue timeout (ms)', kind: 'int', hint: 'How long a request may wait for a slot before 504.' },
  { key: 'queueLength', label: 'Queue length', kind: 'int', hint: 'Requests waiting beyond this get 429.' },
  { key: 'requestTimeoutMs', label: 'Request timeout (ms)', kind: 'int' },
  { key: 'adaptive', label: 'Adaptive concurrency', kind: 'bool' },
  { key: 'adaptiveMin', label: 'Adaptive floor', kind: 'int' },
  { key: 'rpmOverride', label: 'Requests per minute cap', kind: 'intOrNull', hint: 'Empty lets poolgate learn the rate limit.' },
];

async function settingsSection(base: string): Promise<HTMLElement> {
  let current = (await api<{ data: Settings }>('GET', `${base}/settings`)).data;
  const top: Field[] = [
    field('Max concurrent', input('max_concurrent', { type: 'number', value: String(current.max_concurrent), required: true }), 'The pool\'s concurrency cap.'),
    field('Require a pool key', checkbox('require_key', current.require_key)),
    field('Async jobs', checkbox('async_enabled', current.async_enabled)),
    field('Async only when queued', checkbox('async_on_queue', current.async_on_queue)),
  ];
  const nested: Field[] = SETTING_FIELDS.map((s) => {
    const v = current.settings[s.key];
    const control = s.kind === 'bool' ? checkbox(`settings.${s.key}`, v === true) : input(`settings.${s.key}`, { type: 'number', value: v === null || v === undefined ? '' : String(v) });
    return field(s.label, control, s.hint);
  });
  const all = [...top, ...nested];
  const err = formError();
  const saved = h('span', { class: 'saved', role: 'status' });
  const readValue = (f: Field): unknown => {
    const c = f.control as HTMLInputElement;
    if (c.type === 'checkbox') return c.checked;
    const raw = c.value.trim();
    if (raw === '') return null;
    return Number(raw);
  };
  return h('form', {
    class: 'card form', id: 'settings-form', aria: { labelledby: 'settings-title' }, novalidate: true,
    onsubmit: async (ev) => {
      ev.preventDefault();
      clearErrors(all, err);
      saved.textContent = '';
      const patch: Record<string, unknown> = {};
      const settings: Record<string, unknown> = {};
      for (const f of top) {
        const v = readValue(f);
        if (v !== (current as unknown as Record<string, unknown>)[f.name]) patch[f.name] = v === null ? '' : v;
      }
      for (const f of nested) {
        const key = f.name.slice('settings.'.length);
        const v = readValue(f);
        if (v !== (current.settings[key] ?? null)) settings[key] = v;
      }
      if (Object.keys(settings).length) patch.settings = settings;
      if (Object.keys(patch).length === 0) {
        saved.textContent = 'Nothing changed';
        return;
      }
      try {
        current = (await api<{ data: Settings }>('PATCH', `${base}/settings`, patch)).data;
        saved.textContent = 'Saved';
      } catch (e) {
        showError(e, all, err);
      }
    },
  },
  h('h2', { id: 'settings-title' }, 'Settings'),
  top.map((f) => f.row),
  h('details', null, h('summary', null, 'Queue, timeouts and adaptive limits'), nested.map((f) => f.row)),
  err,
  h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'btn primary' }, 'Save settings'), saved));
}

async function keysSection(base: string): Promise<HTMLElement> {
  const tbody = h('tbody');
  const once = h('div', { id: 'key-once' });
  const listErr = h('p', { class: 'form-error', role: 'alert' });
  const load = async () => {
    const { data } = await api<{ data: PoolKey[] }>('GET', `${base}/keys`);
    replace(tbody,
      data.length === 0 ? h('tr', null, h('td', { colspan: '6', class: 'empty' }, 'No keys yet.')) : null,
      data.map((k) => {
        const state = k.revoked_at ? 'revoked' : k.expires_at && Date.parse(k.expires_at) <= Date.now() ? 'expired' : 'active';
        return h('tr', { data: { key: String(k.id) } },
          h('th', { scope: 'row' }, k.label),
          h('td', null, h('code', null, `…${k.last_four}`)),
          h('td', null, k.access),
          h('td', null, fmtTime(k.created_at)),
          h('td', null, k.expires_at ? fmtTime(k.expires_at) : 'never'),
          h('td', null, h('span', { class: `badge ${state === 'active' ? 'ok' : 'muted'}` }, state), ' ',
            state === 'active'
              ? h('button', {
                  type: 'button', class: 'btn small danger', aria: { label: `Revoke key ${k.label} ending ${k.last_four}` },
                  onclick: async () => {
                    if (!confirm(`Revoke the key "${k.label}" (…${k.last_four})? Clients using it are refused at once.`)) return;
                    try {
                      await api('DELETE', `${base}/keys/${k.id}`);
                      await load();
                    } catch (e) {
                      listErr.textContent = (e as Error).message;
                    }
                  },
                }, 'Revoke')
              : null));
      }));
  };
  await load();
  const label = field('Label', input('label', { placeholder: 'e.g. billing worker' }));
  const preset = field('Expires', select('expires_preset', [['none', 'Never'], ['1h', 'In 1 hour'], ['24h', 'In 24 hours'], ['7d', 'In 7 days']], 'none'));
  const access = field('Access', select('access', [['write', 'Write: every method'], ['read', 'Read: GET, HEAD, OPTIONS (and the pool\'s read methods)']], 'write'));
  const all = [label, preset, access];
  const err = formError();
  const form = h('form', {
    class: 'form inline', id: 'mint-form', aria: { labelledby: 'mint-title' },
    onsubmit: async (ev) => {
      ev.preventDefault();
      clearErrors(all, err);
      replace(once);
      const body: Record<string, unknown> = { expires_preset: preset.control.value, access: access.control.value };
      if (label.control.value.trim()) body.label = label.control.value.trim();
      try {
        const { data } = await api<{ data: PoolKey }>('POST', `${base}/keys`, body);
        replace(once, shownOnce('New pool key', data.key!, 'Copy it now: poolgate keeps only its hash and will not show it again.'),
          data.signing_secret ? shownOnce('Signing secret', data.signing_secret, 'Used to sign requests to this pool; shown once.') : null);
        label.control.value = '';
        await load();
      } catch (e) {
        showError(e, all, err);
      }
    },
  }, h('h3', { id: 'mint-title' }, 'Mint a key'), all.map((f) => f.row), err, h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'btn primary' }, 'Mint key')));
  return h('section', { class: 'card', aria: { labelledby: 'keys-title' } },
    h('h2', { id: 'keys-title' }, 'Keys'),
    h('table', { class: 'data compact', id: 'keys-table' },
      h('thead', null, h('tr', null, ['Label', 'Key', 'Access', 'Created', 'Expires', 'State'].map((c) => h('th', { scope: 'col' }, c)))), tbody),
    listErr, once, form);
}

const METHODS_FOR: Record<Pool['backend'], Array<[string, string]>> = {
  http: [['bearer_static', 'Bearer token'], ['api_key', 'API key header'], ['basic', 'Basic auth']],
  postgres: [['postgres_role', 'Database role']],
  mysql: [['postgres_role', 'Database role']],
};
export const SECRET_LABELS: Record<string, string> = { token: 'Bearer token', api_key: 'API key', header_name: 'Header name', username: 'Username', password: 'Password' };
const FIELDS_OF: Record<string, string[]> = { bearer_static: ['token'], api_key: ['api_key', 'header_name'], basic: ['username', 'password'], postgres_role: ['username', 'password'] };

function credentialSection(base: string, pool: Pool, onChange: (p: Pool) => void): HTMLElement {
  const method = field('Method', select('method', METHODS_FOR[pool.backend]));
  const name = field('Credential name (optional)', input('name'));
  const secrets: Field[] = ['token', 'api_key', 'header_name', 'username', 'password'].map((k) =>
    field(SECRET_LABELS[k]!, input(k, { type: k === 'header_name' || k === 'username' ? 'text' : 'password', autocomplete: 'off' }), k === 'header_name' ? 'Optional; x-api-key when empty.' : undefined));
  const all = [method, name, ...secrets];
  const err = formError();
  const done = h('p', { class: 'saved', role: 'status' });
  const sync = () => {
    const want = FIELDS_OF[method.control.value] ?? [];
    for (const s of secrets) s.row.classList.toggle('hidden', !want.includes(s.name));
  };
  method.control.addEventListener('change', sync);
  sync();
  return h('form', {
    class: 'card form', id: 'credential-form', aria: { labelledby: 'cred-title' },
    onsubmit: async (ev) => {
      ev.preventDefault();
      clearErrors(all, err);
      done.textContent = '';
      const body: Record<string, unknown> = { method: method.control.value };
      if (name.control.value.trim()) body.name = name.control.value.trim();
      for (const s of secrets) if (!s.row.classList.contains('hidden') && s.control.value !== '') body[s.name] = s.control.value;
      try {
        const { data } = await api<{ data: Pool }>('POST', `${base}/credential`, body);
        for (const s of secrets) s.control.value = '';
        done.textContent = 'Credential attached; it is stored sealed and never shown again.';
        onChange(data);
      } catch (e) {
        if (e instanceof ApiFailure || e instanceof Error) showError(e, all, err);
      }
    },
  }, h('h2', { id: 'cred-title' }, 'Origin credential'), h('p', { class: 'muted' }, `poolgate adds it to every request it forwards. Currently: ${pool.has_credential ? 'attached' : 'none'}.`),
  all.map((f) => f.row), err, h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'btn primary' }, 'Attach credential'), done));
}

export { orDash };

/** Which webhook destinations receive this pool's finished jobs (PUT /api/v1/pools/{pool}/webhooks replaces the set). */
async function destinationsSection(base: string, pool: Pool): Promise<HTMLElement> {
  let data: Webhook[];
  try {
    data = (await api<{ data: Webhook[] }>('GET', '/api/v1/webhooks')).data;
  } catch (e) {
    // Not fatal for the page (e.g. a token without webhook access): say why here.
    return h('section', { class: 'card' }, h('h2', null, 'Webhook destinations'), h('p', { class: 'form-error' }, (e as Error).message));
  }
  const boxes = data.map((w) => ({ w, f: field(w.name, checkbox(`webhook-${w.id}`, w.pool_ids.includes(pool.id))) }));
  const err = formError();
  const done = h('p', { class: 'saved', role: 'status' });
  const body = boxes.length === 0
    ? h('p', { class: 'muted' }, 'No destinations yet: create one on the Webhooks page.')
    : h('fieldset', null, h('legend', null, 'Send finished jobs to'), boxes.map((b) => b.f.row));
  return h('section', { class: 'card', aria: { labelledby: 'destinations-title' } },
    h('h2', { id: 'destinations-title' }, 'Webhook destinations'),
    h('form', {
      id: 'destinations-form',
      onsubmit: async (ev) => {
        ev.preventDefault();
        err.textContent = '';
        done.textContent = '';
        const ids = boxes.filter((b) => (b.f.control as HTMLInputElement).checked).map((b) => b.w.id);
        try {
          await api('PUT', `${base}/webhooks`, { webhook_endpoint_ids: ids });
          done.textContent = 'Saved';
        } catch (e) {
          err.textContent = (e as Error).message;
        }
      },
    }, body, boxes.length === 0 ? null : h('button', { type: 'submit', class: 'btn' }, 'Save destinations'), err, done));
}
