// Labelled form fields whose error sits beside them (announced to screen readers via aria-describedby
// and role=alert), and the mapping of an API error onto the field it names.
import { fieldOf, ApiFailure } from './api.js';
import { h, uid, type Child } from './dom.js';

export interface Field {
  name: string;
  row: HTMLElement;
  control: HTMLInputElement | HTMLSelectElement;
  error: HTMLElement;
}

export function field(label: string, control: HTMLInputElement | HTMLSelectElement, hint?: string): Field {
  const id = control.id || uid('f');
  control.id = id;
  const errId = `${id}-err`;
  const hintId = `${id}-hint`;
  const error = h('p', { class: 'field-error', id: errId, role: 'alert' });
  control.setAttribute('aria-describedby', hint ? `${hintId} ${errId}` : errId);
  const isCheck = control instanceof HTMLInputElement && control.type === 'checkbox';
  const row = h(
    'div',
    { class: isCheck ? 'field check' : 'field' },
    isCheck ? [control, h('label', { for: id }, label)] : [h('label', { for: id }, label), control],
    hint ? h('p', { class: 'hint', id: hintId }, hint) : null,
    error,
  );
  return { name: control.name, row, control, error };
}

export function input(name: string, props: { type?: string; value?: string; placeholder?: string; required?: boolean; min?: string; max?: string; autocomplete?: string } = {}): HTMLInputElement {
  return h('input', { name, type: props.type ?? 'text', value: props.value, placeholder: props.placeholder, required: props.required, min: props.min, max: props.max, autocomplete: props.autocomplete ?? 'off', spellcheck: false });
}

export function checkbox(name: string, checked: boolean): HTMLInputElement {
  return h('input', { name, type: 'checkbox', checked });
}

export function select(name: string, options: Array<[string, string]>, value?: string): HTMLSelectElement {
  return h('select', { name }, options.map(([v, label]) => h('option', { value: v, selected: v === value }, label)));
}

export function clearErrors(fields: Field[], formError: HTMLElement): void {
  for (const f of fields) {
    f.error.textContent = '';
    f.control.removeAttribute('aria-invalid');
  }
  formError.textContent = '';
}

/** Puts the API's message beside the field it names (focusing it), or above the form when it names none. */
export function showError(err: unknown, fields: Field[], formError: HTMLElement): void {
  const message = err instanceof ApiFailure ? err.message : String((err as Error)?.message ?? err);
  const name = fieldOf(message, fields.map((f) => f.name));
  const f = name ? fields.find((x) => x.name === name) : undefined;
  if (f) {
    // Beside its field the message needs no JSON path: "max_concurrent must be an integer from 1 to 100000".
    f.error.textContent = message.replace(/^body\.(settings\.)?/, '');
    f.control.setAttribute('aria-invalid', 'true');
    f.control.focus();
  } else {
    formError.textContent = message;
  }
}

export function formError(): HTMLElement {
  return h('p', { class: 'form-error', role: 'alert' });
}

/** A secret shown once, with a copy button; the text is a read-only input so it can be selected. */
export function shownOnce(title: string, secret: string, note: Child): HTMLElement {
  const box = h('input', { class: 'secret', type: 'text', value: secret, readonly: true, aria: { label: title } });
  const status = h('span', { class: 'copy-status', role: 'status' });
  const copy = h('button', {
    type: 'button',
    class: 'btn',
    onclick: async () => {
      box.select();
      try {
        await navigator.clipboard.writeText(secret);
        status.textContent = 'Copied';
      } catch {
        status.textContent = 'Press Ctrl+C to copy';
      }
    },
  }, 'Copy');
  return h('div', { class: 'once', role: 'region', aria: { label: title } }, h('h3', null, title), h('p', null, note), h('div', { class: 'secret-row' }, box, copy, status));
}
