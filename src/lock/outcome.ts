// Validates a release body (spec: Release body fields) into the governor's Outcome. Invalid input is a
// message for a 400, never an exception; nothing is released until the whole report is valid.
import type { Outcome, RateFields } from '../governor/governor.js';

const TOP = new Set(['status', 'throttled', 'retryAfterMs', 'rate', 'headers']);
/** Bounds that keep one report small and cheap to read; far above any real response's header block. */
const MAX_HEADERS = 200;
const MAX_HEADER_NAME = 256;
const MAX_HEADER_VALUE = 8192;
const MAX_RATE_MEMBERS = 32;
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const isCount = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

export type Parsed<T> = { ok: true; value: T } | { ok: false; message: string };

/** JSON text of an optional body: empty is `{}`, anything else must be one JSON object. */
export function parseJsonObject(body: Buffer): Parsed<Record<string, unknown>> {
  const text = body.toString('utf8');
  if (text.trim() === '') return { ok: true, value: {} };
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return { ok: false, message: 'the body is not valid JSON' };
  }
  if (!isObject(v)) return { ok: false, message: 'the body must be a JSON object' };
  return { ok: true, value: v };
}

/** The outcome report of a release, with the hold time measured by the service. */
export function parseOutcome(body: Record<string, unknown>): Parsed<Outcome> {
  for (const k of Object.keys(body)) {
    if (!TOP.has(k)) return { ok: false, message: `unknown member ${JSON.stringify(k)}; allowed: status, throttled, retryAfterMs, rate, headers` };
  }
  const out: Outcome = {};
  if (body.status !== undefined) {
    const s = body.status;
    if (!isCount(s) || s < 100 || s > 599) return { ok: false, message: 'status must be an integer from 100 to 599' };
    out.status = s;
  }
  if (body.throttled !== undefined) {
    if (!isCount(body.throttled)) return { ok: false, message: 'throttled must be an integer ≥ 0' };
    out.throttled = body.throttled;
  }
  if (body.retryAfterMs !== undefined) {
    if (!isCount(body.retryAfterMs)) return { ok: false, message: 'retryAfterMs must be an integer ≥ 0 (milliseconds)' };
    out.retryAfterMs = body.retryAfterMs;
  }
  if (body.rate !== undefined) {
    const r = parseRate(body.rate);
    if (!r.ok) return r;
    out.rate = r.value;
  }
  if (body.headers !== undefined) {
    const h = parseHeaders(body.headers);
    if (!h.ok) return h;
    out.headers = h.value;
  }
  return { ok: true, value: out };
}

function parseRate(v: unknown): Parsed<RateFields> {
  if (!isObject(v)) return { ok: false, message: 'rate must be an object' };
  const keys = Object.keys(v);
  if (keys.length > MAX_RATE_MEMBERS) return { ok: false, message: `rate has more than ${MAX_RATE_MEMBERS} members` };
  const rate: RateFields = {};
  for (const k of keys) {
    const x = v[k];
    if (k === 'limit' || k === 'remaining' || k === 'resetMs' || k === 'tokenLimit') {
      if (!isCount(x)) return { ok: false, message: `rate.${k} must be an integer ≥ 0` };
    } else if (typeof x !== 'number' || !Number.isFinite(x)) {
      // Members beyond the four named ones are passed on, but only as numbers: they are pre-parsed figures.
      return { ok: false, message: `rate.${k} must be a number` };
    }
    rate[k] = x;
  }
  return { ok: true, value: rate };
}

function parseHeaders(v: unknown): Parsed<Record<string, string>> {
  if (!isObject(v)) return { ok: false, message: 'headers must be an object of header name to string' };
  const keys = Object.keys(v);
  if (keys.length > MAX_HEADERS) return { ok: false, message: `headers has more than ${MAX_HEADERS} members` };
  const out: Record<string, string> = {};
  for (const k of keys) {
    const x = v[k];
    if (k.length > MAX_HEADER_NAME || !HEADER_NAME.test(k)) return { ok: false, message: `headers: ${JSON.stringify(k.slice(0, 64))} is not a header name` };
    if (typeof x !== 'string' || x.length > MAX_HEADER_VALUE) return { ok: false, message: `headers.${k} must be a string of at most ${MAX_HEADER_VALUE} characters` };
    // Header names are case-insensitive; the learner reads them lower-case, as undici delivers them.
    const name = k.toLowerCase();
    // Joined only to an own property (`constructor` was joined to Object's), as readNodeHeaders and readUwsHeaders do.
    out[name] = Object.hasOwn(out, name) ? `${out[name]}, ${x}` : x;
  }
  return { ok: true, value: out };
}
