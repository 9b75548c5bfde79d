// Budgets: each budget with its pools, their reserved floors, borrowed slots (in flight above the floor)
// and how much of origin_max_concurrent is in use now.
import { api } from './api.js';
import { h, replace, BASE } from './dom.js';
import type { Budget, Pool, PoolLive } from './types.js';
import { REFRESH_MS } from './pools.js';

export function budgetsPage(main: HTMLElement): () => void {
  const body = h('div', { id: 'budgets' });
  const notice = h('p', { class: 'form-error', role: 'alert' });
  replace(main, h('div', { class: 'page-head' }, h('h1', null, 'Budgets')),
    h('p', { class: 'muted' }, 'A capacity budget shares one origin\'s concurrency between pools: each pool keeps its reserved floor and borrows unallocated slots when it needs more.'),
    notice, body);
  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const tick = async () => {
    try {
      const [budgets, pools, live] = await Promise.all([
        api<{ data: Budget[] }>('GET', '/api/v1/budgets'),
        api<{ data: Pool[] }>('GET', '/api/v1/pools'),
        api<{ data: PoolLive[] }>('GET', '/api/v1/metrics/live').catch(() => ({ data: [] as PoolLive[] })),
      ]);
      if (stopped) return;
      const poolById = new Map(pools.data.map((p) => [p.id, p]));
      const liveById = new Map(live.data.map((l) => [l.pool_id, l]));
      replace(body,
        budgets.data.length === 0 ? h('div', { class: 'card empty' }, 'No budgets. An operator creates them with ', h('code', null, 'poolgate admin budget create'), '.') : null,
        budgets.data.map((b) => {
          let inUse = 0;
          const rows = b.pool_ids.map((id) => {
            const p = poolById.get(id);
            const l = liveById.get(id);
            const reserved = p?.budget?.reserved_concurrent ?? 0;
            const inFlight = l?.in_flight ?? null;
            inUse += inFlight ?? 0;
            return h('tr', null,
              h('th', { scope: 'row' }, p ? h('a', { href: `${BASE}/pools/${encodeURIComponent(p.subdomain)}` }, p.name) : `pool ${id}`),
              h('td', { class: 'n' }, String(reserved)),
              h('td', { class: 'n' }, inFlight === null ? '—' : String(inFlight)),
              h('td', { class: 'n' }, inFlight === null ? '—' : String(Math.max(0, inFlight - reserved))));
          });
          const max = b.origin_max_concurrent;
          const pct = max ? Math.min(100, Math.round((100 * inUse) / max)) : 0;
          const fill = h('span', { class: 'bar-fill' });
          fill.style.width = `${pct}%`;
          return h('section', { class: 'card', aria: { label: `Budget ${b.name}` } },
            h('div', { class: 'section-head' }, h('h2', null, b.name)),
            h('dl', { class: 'stats' },
              h('dt', null, 'Origin max concurrent'), h('dd', null, max === null ? 'no cap' : String(max)),
              h('dt', null, 'In use now'), h('dd', null, max === null ? String(inUse) : `${inUse} of ${max}`),
              h('dt', null, 'Unallocated'), h('dd', null, String(b.unallocated))),
            max ? h('span', { class: 'bar wide', aria: { hidden: 'true' } }, fill) : null,
            h('table', { class: 'data compact' },
              h('thead', null, h('tr', null, h('th', { scope: 'col' }, 'Pool'), h('th', { scope: 'col', class: 'n' }, 'Reserved floor'), h('th', { scope: 'col', class: 'n' }, 'In flight'), h('th', { scope: 'col', class: 'n' }, 'Borrowed'))),
              h('tbody', null, rows.length ? rows : h('tr', null, h('td', { colspan: '4', class: 'empty' }, 'No pools in this budget.')))));
        }));
      notice.textContent = '';
    } catch (err) {
      notice.textContent = (err as Error).message;
    }
    if (!stopped) timer = setTimeout(tick, REFRESH_MS * 2);
  };
  void tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
