// The one way the dashboard talks to poolgate: the public Control API, with the session cookie (sent by
// the browser, never readable here) and the session's CSRF token on every change.

export class ApiFailure extends Error {
  constructor(readonly status: number, message: string) {
    super(message);
  }
}

let csrf: string | null = null;
let onSignedOut: () => void = () => {};

export function setCsrf(token: string | null): void {
  csrf = token;
}
export function whenSignedOut(fn: () => void): void {
  onSignedOut = fn;
}

const SAFE = new Set(['GET', 'HEAD']);

export async function api<T = any>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { accept: 'application/json' };
  if (body !== undefined) headers['content-type'] = 'application/json';
  if (!SAFE.has(method) && csrf) headers['x-csrf-token'] = csrf;
  let res: Response;
  try {
    res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), credentials: 'same-origin', cache: 'no-store' });
  } catch {
    throw new ApiFailure(0, 'poolgate did not answer; check that it is running');
  }
  const text = await res.text();
  let parsed: any = undefined;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    /* not JSON */
  }
  if (!res.ok) {
    if (res.status === 401 && path !== '/api/v1/session') onSignedOut();
    throw new ApiFailure(res.status, typeof parsed?.message === 'string' ? parsed.message : `HTTP ${res.status}`);
  }
  return parsed as T;
}

/**
 * Where a validation message belongs: `body.max_concurrent must be …` → "max_concurrent",
 * `body.settings.queueTimeoutMs …` → "settings.queueTimeoutMs"; else the first field name it mentions.
 */
export function fieldOf(message: string, fields: readonly string[]): string | null {
  const m = /^body\.([\w.]+)/.exec(message);
  if (m) {
    const path = m[1]!;
    const hit = fields.find((f) => path === f || path.startsWith(`${f}.`));
    if (hit) return hit;
  }
  const unknown = /unknown property "([^"]+)"/.exec(message);
  if (unknown && fields.includes(unknown[1]!)) return unknown[1]!;
  for (const f of fields) {
    const leaf = f.split('.').pop()!;
    if (new RegExp(`\\b${leaf}\\b`).test(message)) return f;
  }
  return null;
}
