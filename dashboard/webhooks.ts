// Webhooks: destinations with their pools; a destination's details page with Rotate secret (shown once),
// Re-enable, and its delivery history filtered by result, with Replay per delivery and Recover since a time
// (POST /webhooks/{id}/deliveries/{job_id}/replay and /webhooks/{id}/recover).
import { api } from './api.js';
import { h, replace, fmtTime, orDash, BASE } from './dom.js';
import { checkbox, clearErrors, field, formError, input, select, showError, shownOnce } from './forms.js';
import type { Delivery, Pool, Webhook } from './types.js';

const PAGE_SIZE = 20;
const HISTORY = 500;

async function poolNames(): Promise<Map<number, Pool>> {
  const { data } = await api<{ data: Pool[] }>('GET', '/api/v1/pools');
  return new Map(data.map((p) => [p.id, p]));
}

function status(w: Webhook): HTMLElement {
  return h('span', { class: `badge ${w.disabled ? 'bad' : 'ok'}`, data: { state: w.disabled ? 'deactivated' : 'active' } }, w.disabled ? 'Deactivated' : 'Active');
}

function poolList(ids: number[], pools: Map<number, Pool>): HTMLElement | string {
  if (ids.length === 0) return 'none';
  return h('ul', { class: 'inline-list' }, ids.map((id) => {
    const p = pools.get(id);
    return h('li', null, p ? h('a', { href: `${BASE}/pools/${encodeURIComponent(p.subdomain)}` }, p.name) : `pool ${id}`);
  }));
}

/** Issue 26 item 5: a destination is created here too (POST /api/v1/webhooks), its signing secret shown once. */
function createForm(pools: Map<number, Pool>, onCreated: (w: Webhook) => void): HTMLElement {
  const name = field('Name', input('name', { required: true }));
  const url = field('URL', input('url', { type: 'url', required: true, placeholder: 'https://hooks.example.com/poolgate' }), 'https, answering 2xx within 5 s.');
  const boxes = [...pools.values()].map((p) => ({ id: p.id, f: field(p.name, checkbox(`pool-${p.id}`, false)) }));
  const error = formError();
  const shown = h('div', { role: 'status', id: 'webhook-created' });
  const form: HTMLFormElement = h('form', {
    class: 'form', id: 'webhook-create', aria: { label: 'New destination' },
    onsubmit: async (ev) => {
      ev.preventDefault();
      clearErrors([name, url], error);
      replace(shown);
      try {
        const { data } = await api<{ data: Webhook }>('POST', '/api/v1/webhooks', {
          name: name.control.value, url: url.control.value, pool_ids: boxes.filter((b) => (b.f.control as HTMLInputElement).checked).map((b) => b.id),
        });
        replace(shown, shownOnce('Signing secret', data.signing_secret!, 'Give it to the receiver now to verify deliveries; it is not shown again.'));
        form.reset();
        onCreated(data);
      } catch (e) {
        showError(e, [name, url], error);
      }
    },
  }, h('div', { class: 'grid2' }, name.row, url.row),
  boxes.length > 0 ? h('fieldset', null, h('legend', null, 'Send finished jobs of'), boxes.map((b) => b.f.row)) : h('p', { class: 'muted' }, 'No pools yet: attach pools later.'),
  error, h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'btn primary' }, 'Create destination')));
  return h('section', { class: 'card', aria: { labelledby: 'new-webhook-title' } }, h('h2', { id: 'new-webhook-title' }, 'New destination'), form, shown);
}

export function webhooksPage(main: HTMLElement): void {
  replace(main, h('p', { class: 'loading' }, 'Loading…'));
  void (async () => {
    try {
      const [{ data }, pools] = await Promise.all([api<{ data: Webhook[] }>('GET', '/api/v1/webhooks'), poolNames()]);
      const rows = h('tbody', null);
      const render = (list: Webhook[]) => replace(rows, list.length === 0 ? h('tr', null, h('td', { colspan: '4', class: 'empty' }, 'No destinations yet.')) : null,
        list.map((w) => h('tr', { data: { webhook: String(w.id) } },
          h('th', { scope: 'row' }, h('a', { href: `${BASE}/webhooks/${w.id}` }, w.name)),
          h('td', null, h('code', { class: 'url' }, w.url)),
          h('td', null, status(w)),
          h('td', null, poolList(w.pool_ids, pools)))));
      let list = data;
      render(list);
      replace(main, h('div', { class: 'page-head' }, h('h1', null, 'Webhooks')),
        h('p', { class: 'muted' }, 'Destinations receive one signed POST per finished async job. A destination that fails 8 deliveries in a row is deactivated until it is re-enabled here.'),
        h('div', { class: 'card' }, h('table', { class: 'data', id: 'webhooks-table' },
          h('thead', null, h('tr', null, ['Name', 'URL', 'State', 'Pools'].map((c) => h('th', { scope: 'col' }, c)))), rows)),
        createForm(pools, (w) => render((list = [...list, w]))));
    } catch (err) {
      replace(main, h('h1', null, 'Webhooks'), h('p', { class: 'form-error', role: 'alert' }, (err as Error).message));
    }
  })();
}

export function webhookPage(main: HTMLElement, id: number): void {
  replace(main, h('p', { class: 'loading' }, 'Loading…'));
  void (async () => {
    let hook: Webhook | undefined;
    let pools: Map<number, Pool>;
    try {
      const [{ data }, p] = await Promise.all([api<{ data: Webhook[] }>('GET', '/api/v1/webhooks'), poolNames()]);
      hook = data.find((w) => w.id === id);
      pools = p;
    } catch (err) {
      replace(main, h('h1', null, 'Webhook'), h('p', { class: 'form-error', role: 'alert' }, (err as Error).message));
      return;
    }
    if (!hook) {
      replace(main, h('h1', null, 'Webhook'), h('p', { class: 'form-error', role: 'alert' }, 'webhook destination not found'), h('a', { href: `${BASE}/webhooks` }, 'Back to webhooks'));
      return;
    }
    let w: Webhook = hook;
    const state = h('span', null, status(w));
    const message = h('div', { role: 'status', id: 'webhook-message' });
    const actions = h('div', { class: 'actions' });
    const renderActions = () => {
      replace(actions,
        w.disabled ? h('button', {
          type: 'button', class: 'btn primary', id: 'reenable',
          onclick: async () => {
            try {
              w = (await api<{ data: Webhook }>('POST', `/api/v1/webhooks/${w.id}/enable`)).data;
              replace(state, status(w));
              replace(message, h('p', { class: 'saved' }, 'Re-enabled: deliveries resume.'));
              renderActions();
            } catch (e) {
              replace(message, h('p', { class: 'form-error' }, (e as Error).message));
            }
          },
        }, 'Re-enable') : null,
        h('button', {
          type: 'button', class: 'btn', id: 'rotate',
          onclick: async () => {
            if (!confirm('Rotate the signing secret? Receivers must switch to the new secret.')) return;
            try {
              const { data } = await api<{ data: Webhook }>('POST', `/api/v1/webhooks/${w.id}/rotate`);
              replace(message, shownOnce('New signing secret', data.signing_secret!, 'Give it to the receiver now; it is not shown again.'));
            } catch (e) {
              replace(message, h('p', { class: 'form-error' }, (e as Error).message));
            }
          },
        }, 'Rotate secret'));
    };
    renderActions();
    const filter = field('Show', select('result', [['', 'All deliveries'], ['failure', 'Failures'], ['success', 'Successes']], ''));
    const tbody = h('tbody');
    const historyMessage = h('div', { role: 'status' });
    const replay = async (d: Delivery) => {
      try {
        await api('POST', `/api/v1/webhooks/${w.id}/deliveries/${encodeURIComponent(d.job_id)}/replay`);
        replace(historyMessage, h('p', { class: 'saved' }, `Replay of job ${d.job_id} queued: it is delivered again shortly.`));
      } catch (e) {
        replace(historyMessage, h('p', { class: 'form-error' }, (e as Error).message));
      }
    };
    // Recover: every delivery of this destination given up since a time is queued again (after an outage at the receiver).
    const since = field('Since', input('since', { type: 'datetime-local', required: true }), 'Deliveries given up after their retries, whose event happened at or after this time (your local time), are sent again.');
    const recoverError = formError();
    const recoverForm = h('form', {
      class: 'inline-form', aria: { label: 'Recover deliveries' },
      onsubmit: async (ev) => {
        ev.preventDefault();
        clearErrors([since], recoverError);
        replace(historyMessage);
        const at = new Date(since.control.value);
        if (since.control.value === '' || Number.isNaN(at.getTime())) {
          since.error.textContent = 'Pick a date and time.';
          since.control.setAttribute('aria-invalid', 'true');
          return;
        }
        try {
          const { data } = await api<{ data: { recovered: number } }>('POST', `/api/v1/webhooks/${w.id}/recover`, { since: at.toISOString() });
          replace(historyMessage, h('p', { class: 'saved' }, `${data.recovered} failed ${data.recovered === 1 ? 'delivery' : 'deliveries'} queued again.`));
        } catch (e) {
          showError(e, [since], recoverError);
        }
      },
    }, since.row, h('button', { type: 'submit', class: 'btn' }, 'Recover'), recoverError);
    // The newest HISTORY deliveries, PAGE_SIZE rows at a time: a busy destination's history stays a page long.
    const pager = h('div', { class: 'pager', id: 'deliveries-pager' });
    let all: Delivery[] = [];
    let page = 0;
    const show = () => {
      const pages = Math.max(1, Math.ceil(all.length / PAGE_SIZE));
      page = Math.min(page, pages - 1);
      const rows = all.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE);
      replace(tbody, rows.length === 0 ? h('tr', null, h('td', { colspan: '8', class: 'empty' }, 'No deliveries.')) : null,
        rows.map((d) => h('tr', { data: { result: d.result, job: d.job_id } },
          h('td', null, fmtTime(d.time)), h('td', null, h('code', null, d.job_id)), h('td', null, orDash(d.pool)),
          h('td', null, h('span', { class: `badge ${d.result === 'success' ? 'ok' : 'bad'}` }, d.result)),
          h('td', { class: 'n' }, orDash(d.http_status)), h('td', { class: 'n' }, `${d.latency_ms} ms`), h('td', { class: 'err-text' }, orDash(d.error)),
          h('td', null, h('button', { type: 'button', class: 'btn small', aria: { label: `Replay the delivery of job ${d.job_id}` }, onclick: () => void replay(d) }, 'Replay')))));
      replace(pager, all.length <= PAGE_SIZE ? null : [
        h('button', { type: 'button', class: 'btn small', disabled: page === 0, onclick: () => { page--; show(); } }, 'Newer'),
        h('span', { data: { field: 'page' } }, `${page * PAGE_SIZE + 1}–${page * PAGE_SIZE + rows.length} of ${all.length}${all.length === HISTORY ? ' (the newest)' : ''}`),
        h('button', { type: 'button', class: 'btn small', disabled: page === pages - 1, onclick: () => { page++; show(); } }, 'Older'),
      ]);
    };
    const load = async () => {
      const q = new URLSearchParams({ limit: String(HISTORY), ...(filter.control.value ? { result: filter.control.value } : {}) });
      all = (await api<{ data: Delivery[] }>('GET', `/api/v1/webhooks/${w.id}/deliveries?${q}`)).data;
      page = 0;
      show();
    };
    filter.control.addEventListener('change', () => void load());
    replace(main,
      h('nav', { class: 'crumbs', aria: { label: 'Breadcrumb' } }, h('a', { href: `${BASE}/webhooks` }, 'Webhooks'), ' / ', w.name),
      h('div', { class: 'page-head' }, h('h1', null, w.name), state),
      h('section', { class: 'card' },
        h('dl', { class: 'props' },
          h('dt', null, 'URL'), h('dd', null, h('code', { class: 'url' }, w.url)),
          h('dt', null, 'Description'), h('dd', null, orDash(w.description)),
          h('dt', null, 'Pools'), h('dd', null, poolList(w.pool_ids, pools!))),
        actions, message),
      h('section', { class: 'card', aria: { labelledby: 'deliveries-title' } },
        h('div', { class: 'section-head' }, h('h2', { id: 'deliveries-title' }, 'Deliveries'), filter.row),
        recoverForm, historyMessage,
        h('table', { class: 'data compact', id: 'deliveries-table' },
          h('thead', null, h('tr', null, ['Time', 'Job', 'Pool', 'Result', 'Status', 'Latency', 'Error', 'Actions'].map((c) => h('th', { scope: 'col' }, c)))), tbody),
        pager));
    await load();
  })();
}
