// The dashboard's entry: sign-in (an API token pasted once, or a one-time sign-in link), the layout,
// and the page of the current path. Everything goes through the public Control API.
import 'uplot/dist/uPlot.min.css';
import './app.css';
import { api, ApiFailure, setCsrf, whenSignedOut } from './api.js';
import { h, replace, BASE } from './dom.js';
import { field, input, formError, clearErrors, showError } from './forms.js';
import { onRoute, navigate } from './router.js';
import { poolsPage } from './pools.js';
import { poolPage } from './pool.js';
import { budgetsPage } from './budgets.js';
import { webhooksPage, webhookPage } from './webhooks.js';
import type { Me, Session } from './types.js';

const root = document.getElementById('app')!;
let me: Me | null = null;
let cleanup: (() => void) | void;

function signInPage(): void {
  const token = field('API token', input('token', { type: 'password', required: true, autocomplete: 'off', placeholder: 'pgt_…' }),
    'Pasted once: poolgate keeps a session cookie instead; the token is not stored in this browser.');
  const err = formError();
  replace(root, h('main', { id: 'main', class: 'signin' },
    h('form', {
      class: 'card form', id: 'signin-form', aria: { labelledby: 'signin-title' },
      onsubmit: async (ev) => {
        ev.preventDefault();
        clearErrors([token], err);
        try {
          const s = await api<Session>('POST', '/api/v1/session', { token: token.control.value.trim() });
          token.control.value = '';
          setCsrf(s.csrf_token);
          await start();
        } catch (e) {
          if (e instanceof ApiFailure && e.status === 401) err.textContent = 'That token is not valid (unknown, revoked or expired).';
          else showError(e, [token], err);
        }
      },
    },
    h('div', { class: 'brand big' }, logo(), 'poolgate'),
    h('h1', { id: 'signin-title' }, 'Sign in'),
    token.row,
    err,
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'btn primary' }, 'Sign in')),
    h('p', { class: 'muted' }, 'Or ask an operator for a one-time sign-in link: ', h('code', { class: 'command' }, ...['npx poolgate admin login-link', '--team TEAM', '--email EMAIL'].flatMap((part, i) => [i ? ' ' : '', h('span', { class: 'nowrap' }, part)]))))));
  (token.control as HTMLInputElement).focus();
}

function linkSignInPage(link: string): void {
  const err = formError();
  // The secret is in the fragment: take it out of the address bar and history before anything else.
  history.replaceState(null, '', `${BASE}/login`);
  replace(root, h('main', { id: 'main', class: 'signin' },
    h('div', { class: 'card form' },
      h('div', { class: 'brand big' }, logo(), 'poolgate'),
      h('h1', null, 'Sign in with a one-time link'),
      h('p', null, 'This link works once and expires 15 minutes after it was made.'),
      err,
      h('div', { class: 'actions' }, h('button', {
        type: 'button', class: 'btn primary', id: 'link-signin',
        onclick: async () => {
          try {
            const s = await api<Session>('POST', '/api/v1/session', { login_link: link });
            setCsrf(s.csrf_token);
            history.replaceState(null, '', `${BASE}/pools`);
            await start();
          } catch (e) {
            err.textContent = (e as Error).message;
          }
        },
      }, 'Sign in')))));
}

function logo(): SVGSVGElement {
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  svg.setAttribute('viewBox', '0 0 24 24');
  svg.setAttribute('aria-hidden', 'true');
  svg.setAttribute('class', 'logo');
  for (const [x, op] of [[3, '1'], [10, '.7'], [17, '.4']] as const) {
    const r = document.createElementNS('http://www.w3.org/2000/svg', 'rect');
    r.setAttribute('x', String(x)); r.setAttribute('y', '4'); r.setAttribute('width', '4'); r.setAttribute('height', '16'); r.setAttribute('rx', '1.5');
    r.setAttribute('fill', 'currentColor'); r.setAttribute('opacity', op);
    svg.appendChild(r);
  }
  return svg;
}

function layout(): HTMLElement {
  const path = location.pathname;
  const link = (href: string, label: string) =>
    h('a', { href, aria: path === href || path.startsWith(`${href}/`) ? { current: 'page' } : {} }, label);
  const main = h('main', { id: 'main', tabindex: '-1' });
  replace(root,
    h('header', { class: 'top' },
      h('div', { class: 'brand' }, logo(), 'poolgate'),
      h('nav', { aria: { label: 'Main' } }, link(`${BASE}/pools`, 'Pools'), link(`${BASE}/budgets`, 'Budgets'), link(`${BASE}/webhooks`, 'Webhooks')),
      h('div', { class: 'who' },
        h('span', null, me!.user.name, h('span', { class: 'muted' }, ` · ${me!.team.name}`)),
        h('button', {
          type: 'button', class: 'btn small', id: 'signout',
          onclick: async () => {
            try {
              await api('DELETE', '/api/v1/session');
            } finally {
              setCsrf(null);
              me = null;
              history.pushState(null, '', BASE);
              signInPage();
            }
          },
        }, 'Sign out'))),
    main);
  return main;
}

function route(): void {
  if (typeof cleanup === 'function') cleanup();
  cleanup = undefined;
  if (!me) return;
  const rest = location.pathname.slice(BASE.length).replace(/\/+$/, '');
  const main = layout();
  let m: RegExpExecArray | null;
  if (rest === '' || rest === '/pools' || rest === '/login') {
    if (rest !== '/pools') history.replaceState(null, '', `${BASE}/pools`);
    cleanup = poolsPage(main);
    document.title = 'Pools · poolgate';
  } else if ((m = /^\/pools\/([^/]+)$/.exec(rest))) {
    const sub = decodeURIComponent(m[1]!);
    cleanup = poolPage(main, sub);
    document.title = `${sub} · poolgate`;
  } else if (rest === '/budgets') {
    cleanup = budgetsPage(main);
    document.title = 'Budgets · poolgate';
  } else if (rest === '/webhooks') {
    webhooksPage(main);
    document.title = 'Webhooks · poolgate';
  } else if ((m = /^\/webhooks\/(\d{1,10})$/.exec(rest))) {
    webhookPage(main, Number(m[1]));
    document.title = 'Webhook · poolgate';
  } else {
    replace(main, h('h1', null, 'Not found'), h('p', null, h('a', { href: `${BASE}/pools` }, 'Go to pools')));
  }
  main.focus({ preventScroll: true });
}

async function start(): Promise<void> {
  try {
    const s = await api<Session>('GET', '/api/v1/session');
    setCsrf(s.csrf_token);
    me = await api<Me>('GET', '/api/v1/me');
  } catch {
    me = null;
    const link = location.pathname === `${BASE}/login` && /^#pgl_[A-Za-z0-9]{40}$/.test(location.hash) ? location.hash.slice(1) : null;
    if (link) linkSignInPage(link);
    else signInPage();
    return;
  }
  route();
}

whenSignedOut(() => {
  if (!me) return;
  me = null;
  setCsrf(null);
  signInPage();
});
onRoute(route);
void start();
export { navigate };
