// DOM building without HTML strings: every text goes in as a text node, every attribute through
// setAttribute on a fixed list, so no pool name, key label, URL or error text can become markup or a
// script. Links only ever point inside the dashboard.

export type Child = Node | string | number | null | undefined | false | Child[];

type Handler<E extends Event = Event> = (ev: E) => void;

export interface Props {
  class?: string;
  id?: string;
  type?: string;
  name?: string;
  value?: string;
  placeholder?: string;
  for?: string;
  role?: string;
  title?: string;
  min?: string;
  max?: string;
  step?: string;
  required?: boolean;
  disabled?: boolean;
  checked?: boolean;
  selected?: boolean;
  readonly?: boolean;
  novalidate?: boolean;
  autocomplete?: string;
  spellcheck?: boolean;
  href?: string;
  scope?: string;
  tabindex?: string;
  colspan?: string;
  aria?: Record<string, string>;
  data?: Record<string, string>;
  onclick?: Handler<MouseEvent>;
  onsubmit?: Handler<SubmitEvent>;
  onchange?: Handler;
  oninput?: Handler;
}

const BOOL = ['required', 'disabled', 'checked', 'selected', 'readonly', 'novalidate'] as const;
const PLAIN = ['class', 'id', 'type', 'name', 'placeholder', 'for', 'role', 'title', 'min', 'max', 'step', 'autocomplete', 'scope', 'tabindex', 'colspan'] as const;

export const BASE = '/dashboard';

/** A path inside the dashboard; anything else (a javascript: URL, another site) is refused. */
export function internal(href: string): string {
  if (!href.startsWith(`${BASE}/`) && href !== BASE) throw new Error(`not a dashboard link: ${href}`);
  return href;
}

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, props?: Props | null, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  if (props) {
    for (const k of PLAIN) {
      const v = props[k];
      if (v !== undefined) el.setAttribute(k, v);
    }
    for (const k of BOOL) if (props[k]) el.setAttribute(k, '');
    if (props.value !== undefined) (el as unknown as HTMLInputElement).value = props.value;
    if (props.checked !== undefined) (el as unknown as HTMLInputElement).checked = props.checked;
    if (props.spellcheck !== undefined) el.spellcheck = props.spellcheck;
    if (props.href !== undefined) el.setAttribute('href', internal(props.href));
    for (const [k, v] of Object.entries(props.aria ?? {})) el.setAttribute(`aria-${k}`, v);
    for (const [k, v] of Object.entries(props.data ?? {})) el.setAttribute(`data-${k}`, v);
    if (props.onclick) el.addEventListener('click', props.onclick as EventListener);
    if (props.onsubmit) el.addEventListener('submit', props.onsubmit as EventListener);
    if (props.onchange) el.addEventListener('change', props.onchange);
    if (props.oninput) el.addEventListener('input', props.oninput);
  }
  append(el, children);
  return el;
}

export function append(parent: Node, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(parent, c);
    else if (c instanceof Node) parent.appendChild(c);
    else parent.appendChild(document.createTextNode(String(c)));
  }
}

export function replace(parent: Element, ...children: Child[]): void {
  parent.replaceChildren();
  append(parent, children);
}

/** Text that may be absent: an em dash instead. */
export const orDash = (v: string | number | null | undefined): string => (v === null || v === undefined || v === '' ? '—' : String(v));

export function fmtTime(iso: string | null | undefined): string {
  if (!iso) return '—';
  const d = new Date(iso);
  return d.toLocaleString(undefined, { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit' });
}

let idSeq = 0;
export const uid = (prefix: string): string => `${prefix}-${++idSeq}`;
