// Parses an upstream's rate-limit headers (retry-after, x-ratelimit-*, anthropic-ratelimit-*, IETF ratelimit-*)
// into one RateInfo for the RPM learner.

/** What the upstream said about its request rate. NaN means "not said". */
export interface RateInfo {
  /** Requests allowed per window. */
  limit: number;
  /** Requests left in the current window. */
  remaining: number;
  /** Time until the window resets, ms. */
  resetMs: number;
  /** The window `limit` counts over, ms (a stated policy); NaN means the usual minute. */
  windowMs: number;
  /** Tokens allowed per window (LLM APIs); recorded, not gated: a request's token cost is unknown here. */
  tokenLimit: number;
  /** Do not send before this many ms (Retry-After). */
  retryAfterMs: number;
}

export type HeaderValue = string | string[] | undefined;
export type Headers = Readonly<Record<string, HeaderValue>>;

export function emptyRateInfo(): RateInfo {
  return { limit: NaN, remaining: NaN, resetMs: NaN, windowMs: NaN, tokenLimit: NaN, retryAfterMs: NaN };
}

export function clearRateInfo(r: RateInfo): RateInfo {
  r.limit = r.remaining = r.resetMs = r.windowMs = r.tokenLimit = r.retryAfterMs = NaN;
  return r;
}

/** True when any field was said. */
export function hasRateInfo(r: RateInfo): boolean {
  return !(
    Number.isNaN(r.limit) &&
    Number.isNaN(r.remaining) &&
    Number.isNaN(r.resetMs) &&
    Number.isNaN(r.tokenLimit) &&
    Number.isNaN(r.retryAfterMs)
  );
}

/** Epoch values above this are timestamps, not deltas (1e9 s is 2001; no window lasts 31 years). */
const EPOCH_SECONDS = 1e9;
const EPOCH_MS = 1e12;
const DURATION = /^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?$/;
const NUMBER = /^\d+(?:\.\d+)?$/;

function first(v: HeaderValue): string | undefined {
  const s = Array.isArray(v) ? v[0] : v;
  if (s === undefined) return undefined;
  const t = s.trim();
  return t === '' ? undefined : t;
}

function count(s: string | undefined): number {
  if (s === undefined) return NaN;
  const m = /^\d+(?:\.\d+)?/.exec(s);
  return m ? Math.floor(Number(m[0])) : NaN;
}

/** Retry-After: delay seconds, or an HTTP date (RFC 9110). Never negative. */
export function parseRetryAfter(v: HeaderValue, nowEpochMs: number): number {
  const s = first(v);
  if (s === undefined) return NaN;
  if (NUMBER.test(s)) return Number(s) * 1000;
  const at = Date.parse(s);
  return Number.isNaN(at) ? NaN : Math.max(0, at - nowEpochMs);
}

/**
 * A reset in any of the shapes upstreams use: delta seconds ("30", "0.5"), epoch seconds or ms
 * ("1700000000"), a Go-style duration ("6m0s", "1.5s", "20ms", as OpenAI sends) or a date
 * (RFC 3339 as Anthropic sends, or an HTTP date). Returns ms from now, never negative.
 */
export function parseReset(v: HeaderValue, nowEpochMs: number): number {
  const s = first(v);
  if (s === undefined) return NaN;
  if (NUMBER.test(s)) {
    const n = Number(s);
    if (n >= EPOCH_MS) return Math.max(0, n - nowEpochMs);
    if (n >= EPOCH_SECONDS) return Math.max(0, n * 1000 - nowEpochMs);
    return n * 1000;
  }
  const d = DURATION.exec(s);
  if (d && s !== '') {
    return (Number(d[1] ?? 0) * 3600 + Number(d[2] ?? 0) * 60 + Number(d[3] ?? 0)) * 1000 + Number(d[4] ?? 0);
  }
  const at = Date.parse(s);
  return Number.isNaN(at) ? NaN : Math.max(0, at - nowEpochMs);
}

/** `name=value` or `name;value` parameter of a header item, as a number. */
function param(item: string, name: ParamName): number {
  const m = PARAMS[name].exec(item);
  return m ? Number(m[1]) : NaN;
}

type ParamName = 'q' | 'w' | 'r' | 't' | 'limit' | 'remaining' | 'reset';
const paramPattern = (name: string): RegExp => new RegExp(`(?:^|[;,\\s])${name}\\s*=\\s*"?(\\d+(?:\\.\\d+)?)`, 'i');
const PARAMS: Readonly<Record<ParamName, RegExp>> = {
  q: paramPattern('q'),
  w: paramPattern('w'),
  r: paramPattern('r'),
  t: paramPattern('t'),
  limit: paramPattern('limit'),
  remaining: paramPattern('remaining'),
  reset: paramPattern('reset'),
};

/** Items of a list header; a multi-valued header counts as one list. */
function items(v: HeaderValue): string[] {
  const all = Array.isArray(v) ? v.join(',') : (v ?? '');
  return all.split(',').map((s) => s.trim()).filter((s) => s !== '');
}

/**
 * `ratelimit-policy` (IETF draft): `100;w=60` (draft 03–06, a list; `10;w=1, 100;w=60`) or
 * `"default";q=100;w=60` (draft 07 on). Several policies: the lowest per-minute quota wins, so the gate
 * stays under every one of them.
 */
function applyPolicy(v: HeaderValue, out: RateInfo): void {
  let best = NaN;
  for (const it of items(v)) {
    const quota = it.startsWith('"') ? param(it, 'q') : count(it);
    if (!(quota >= 0)) continue;
    const w = param(it, 'w');
    const windowMs = w > 0 ? w * 1000 : 60_000;
    const perMinute = (quota * 60_000) / windowMs;
    if (Number.isNaN(best) || perMinute < best) {
      best = perMinute;
      out.limit = quota;
      out.windowMs = windowMs;
    }
  }
}

/**
 * `ratelimit` (IETF draft): `limit=100, remaining=50, reset=30` (draft 03, one dictionary) or
 * `"default";r=50;t=30` (draft 07 on, a list of policies; the one with the fewest left wins). The
 * dictionary's `limit` is the window closest to exhaustion, which may be a burst policy: a stated
 * policy list (`hasPolicy`) keeps its lowest per-minute quota instead.
 */
function applyRateLimit(v: HeaderValue, out: RateInfo, hasPolicy: boolean): void {
  const all = Array.isArray(v) ? v.join(',') : (v ?? '');
  if (/(?:^|[,\s])(?:limit|remaining|reset)\s*=/i.test(all)) {
    const limit = param(all, 'limit');
    const remaining = param(all, 'remaining');
    const reset = param(all, 'reset');
    if (limit >= 0 && !hasPolicy) out.limit = Math.floor(limit);
    if (remaining >= 0) out.remaining = Math.floor(remaining);
    if (reset >= 0) out.resetMs = reset * 1000;
    return;
  }
  for (const it of items(v)) {
    const r = param(it, 'r');
    if (!(r >= 0) || (!Number.isNaN(out.remaining) && r >= out.remaining)) continue;
    out.remaining = Math.floor(r);
    const t = param(it, 't');
    out.resetMs = t >= 0 ? t * 1000 : NaN;
  }
}

/**
 * Fills `out` (cleared first) from response headers; names are matched case-insensitively. Request
 * counts in `-requests` variants win over the plain `x-ratelimit-*` ones; the IETF headers fill only
 * what the vendor headers left unsaid. `nowEpochMs` is wall-clock time, for dates in the headers.
 * Returns `out`.
 */
export function parseRateHeaders(headers: Headers, nowEpochMs: number, out: RateInfo): RateInfo {
  clearRateInfo(out);
  let plainLimit: HeaderValue, plainRemaining: HeaderValue, plainReset: HeaderValue;
  let reqLimit: HeaderValue, reqRemaining: HeaderValue, reqReset: HeaderValue, tokLimit: HeaderValue;
  let ietf: HeaderValue, policy: HeaderValue, ietfLimit: HeaderValue, ietfRemaining: HeaderValue, ietfReset: HeaderValue;
  let retryAfter: HeaderValue;
  for (const raw in headers) {
    // Cheap rejection first (most responses carry none of these): every name that matters is
    // "retry-after", "ratelimit…", "x-ratelimit…" (x-ra) or "anthropic-ratelimit…" (30+ characters).
    const c = raw.charCodeAt(0) | 0x20;
    if (c === 0x78) {
      if (raw.length < 17 || (raw.charCodeAt(2) | 0x20) !== 0x72 || (raw.charCodeAt(3) | 0x20) !== 0x61) continue;
    } else if (c === 0x72) {
      if (raw.length < 9) continue;
    } else if (c !== 0x61 || raw.length < 30) continue;
    const v = headers[raw];
    switch (raw.toLowerCase()) {
      case 'retry-after':
        retryAfter = v;
        break;
      case 'x-ratelimit-limit':
        plainLimit = v;
        break;
      case 'x-ratelimit-remaining':
        plainRemaining = v;
        break;
      case 'x-ratelimit-reset':
        plainReset = v;
        break;
      case 'x-ratelimit-limit-requests':
      case 'anthropic-ratelimit-requests-limit':
        reqLimit = v;
        break;
      case 'x-ratelimit-remaining-requests':
      case 'anthropic-ratelimit-requests-remaining':
        reqRemaining = v;
        break;
      case 'x-ratelimit-reset-requests':
      case 'anthropic-ratelimit-requests-reset':
        reqReset = v;
        break;
      case 'x-ratelimit-limit-tokens':
      case 'anthropic-ratelimit-tokens-limit':
        tokLimit = v;
        break;
      case 'ratelimit':
        ietf = v;
        break;
      case 'ratelimit-policy':
        policy = v;
        break;
      case 'ratelimit-limit':
        ietfLimit = v;
        break;
      case 'ratelimit-remaining':
        ietfRemaining = v;
        break;
      case 'ratelimit-reset':
        ietfReset = v;
        break;
    }
  }
  out.retryAfterMs = parseRetryAfter(retryAfter, nowEpochMs);
  out.tokenLimit = count(first(tokLimit));
  out.limit = count(first(reqLimit ?? plainLimit));
  out.remaining = count(first(reqRemaining ?? plainRemaining));
  out.resetMs = parseReset(reqReset ?? plainReset, nowEpochMs);

  if (ietf !== undefined || policy !== undefined || ietfLimit !== undefined) {
    const vendor = { limit: out.limit, remaining: out.remaining, resetMs: out.resetMs };
    // Draft 01–02: separate headers; `ratelimit-limit` may carry the policy too ("100, 100;w=60").
    if (ietfLimit !== undefined) {
      out.limit = count(first(ietfLimit));
      const w = param(items(ietfLimit).find((i) => i.includes(';')) ?? '', 'w');
      if (w > 0) out.windowMs = w * 1000;
    }
    if (ietfRemaining !== undefined) out.remaining = count(first(ietfRemaining));
    if (ietfReset !== undefined) out.resetMs = parseReset(ietfReset, nowEpochMs);
    if (policy !== undefined) applyPolicy(policy, out);
    if (ietf !== undefined) applyRateLimit(ietf, out, policy !== undefined);
    // The vendor headers are the more specific statement where both speak.
    if (!Number.isNaN(vendor.limit)) {
      out.limit = vendor.limit;
      out.windowMs = NaN;
    }
    if (!Number.isNaN(vendor.remaining)) out.remaining = vendor.remaining;
    if (!Number.isNaN(vendor.resetMs)) out.resetMs = vendor.resetMs;
  }
  return out;
}

/** The lock release's pre-parsed `rate` object; it wins over headers, field by field where given. */
export interface RateObject {
  limit?: number;
  remaining?: number;
  resetMs?: number;
  tokenLimit?: number;
}

/** Overlays a `rate` object onto `out` (non-negative finite numbers only). */
export function applyRateObject(rate: RateObject, out: RateInfo): RateInfo {
  const ok = (n: unknown): n is number => typeof n === 'number' && Number.isFinite(n) && n >= 0;
  if (ok(rate.limit)) {
    out.limit = Math.floor(rate.limit);
    out.windowMs = NaN;
  }
  if (ok(rate.remaining)) out.remaining = Math.floor(rate.remaining);
  if (ok(rate.resetMs)) out.resetMs = rate.resetMs;
  if (ok(rate.tokenLimit)) out.tokenLimit = Math.floor(rate.tokenLimit);
  return out;
}
