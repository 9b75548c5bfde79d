// The one-shot intake form: intake_url opened in a browser. It reads what the handoff asks for and posts
// the secret fields once to the same address (the link's token is the authority; no sign-in).
import './app.css';
import { api, ApiFailure } from './api.js';
import { h, replace } from './dom.js';
import { field, input, formError, clearErrors, showError, type Field } from './forms.js';

const LABELS: Record<string, string> = { token: 'Bearer token', api_key: 'API key', header_name: 'Header name', username: 'Username', password: 'Password' };
const PLAIN = new Set(['header_name', 'username']);

interface IntakeInfo { pool: { name: string; subdomain: string }; auth_method: string; required_fields: string[]; optional_fields: string[]; expires_at: string }

const root = document.getElementById('app')!;
const path = location.pathname;

function dead(message: string): void {
  replace(root, h('main', { id: 'main', class: 'signin' }, h('div', { class: 'card form' }, h('h1', null, 'This link cannot be used'), h('p', { role: 'alert', id: 'intake-dead' }, message))));
}

async function main(): Promise<void> {
  let info: IntakeInfo;
  try {
    info = await api<IntakeInfo>('GET', path);
  } catch (e) {
    dead(e instanceof ApiFailure && e.status === 404 ? 'This intake link is not valid.' : (e as Error).message);
    return;
  }
  const fields: Field[] = [
    ...info.required_fields.map((f) => field(LABELS[f] ?? f, input(f, { type: PLAIN.has(f) ? 'text' : 'password', required: true }))),
    ...info.optional_fields.map((f) => field(`${LABELS[f] ?? f} (optional)`, input(f), f === 'header_name' ? 'The header the key is sent in; x-api-key when empty.' : undefined)),
  ];
  const err = formError();
  replace(root, h('main', { id: 'main', class: 'signin' },
    h('form', {
      class: 'card form', id: 'intake-form', aria: { labelledby: 'intake-title' },
      onsubmit: async (ev) => {
        ev.preventDefault();
        clearErrors(fields, err);
        const body: Record<string, string> = {};
        for (const f of fields) if (f.control.value !== '') body[f.name] = f.control.value;
        try {
          await api('POST', path, body);
          replace(root, h('main', { id: 'main', class: 'signin' }, h('div', { class: 'card form' },
            h('h1', null, 'Credential saved'),
            h('p', { role: 'status', id: 'intake-done' }, `The credential is sealed and attached to ${info.pool.name}. This link is now used and no longer works.`))));
        } catch (e) {
          if (e instanceof ApiFailure && e.status === 410) dead(e.message);
          else showError(e, fields, err);
        }
      },
    },
    h('h1', { id: 'intake-title' }, 'Enter a credential'),
    h('p', null, 'For the pool ', h('strong', null, info.pool.name), ' (', h('code', null, info.pool.subdomain), '), method ', h('code', null, info.auth_method), '.'),
    h('p', { class: 'muted' }, `The secret goes straight into sealed storage; nobody can read it back. This form works once, until ${new Date(info.expires_at).toLocaleString()}.`),
    fields.map((f) => f.row),
    err,
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'btn primary' }, 'Save credential')))));
  (fields[0]?.control as HTMLInputElement | undefined)?.focus();
}

void main();
