// Stage 3, scope: a `read` key admits GET, HEAD, OPTIONS and the pool's extra read methods (optionally
// limited to path prefixes); any other method is refused here, before the origin and before a slot.
// A method-override header (X-HTTP-Method-Override and kin) is judged as the method it names: many
// frameworks honour it, so a read key's GET that says DELETE is a DELETE. So is a `_method` parameter in the
// query or in a form body (Rails, Laravel, Symfony read it on a POST), judged the same way (issue 25 item 3).
import { reply, type Exchange, type Stage, type Reply } from '../pool-request/exchange.js';
import type { PoolEntry } from '../pool-request/snapshot.js';
import { canonicalPath, underPrefix } from './scoped-path.js';

const FORBIDDEN: Reply = reply(403, 'forbidden', 'this key is read-only and does not admit this method or path');
const NOT_CANONICAL: Reply = reply(
  403,
  'forbidden',
  "this key is limited to paths: its path may not hold an escaped '/', '\\' or '%', a '\\', ';' or control bytes",
);
const BASE = new Set(['GET', 'HEAD', 'OPTIONS']);
/** Headers that frameworks (Rails, Express method-override, Symfony, ASP.NET, Google APIs) read as the method. */
export const METHOD_OVERRIDE_HEADERS = ['x-http-method-override', 'x-http-method', 'x-method-override'] as const;

/** null: `method` is admitted on `path` (which may become canonical); else the refusal. */
function judge(pool: PoolEntry, method: string, ex: Exchange): Reply | null {
  if (!pool.readMethods.has(method)) return FORBIDDEN;
  if (BASE.has(method)) return null;
  const prefixes = pool.readPaths.get(method);
  if (prefixes === undefined) return null;
  const path = canonicalPath(ex.path);
  if (path === null) return NOT_CANONICAL;
  for (const p of prefixes) {
    if (underPrefix(path, p)) {
      // The origin gets the path that was judged, not one its own decoder may read differently.
      ex.path = path;
      return null;
    }
  }
  return FORBIDDEN;
}

export function scopeStage(): Stage {
  return (ex: Exchange) => {
    const key = ex.key;
    const pool = ex.pool!;
    // Spec, key access semantics 3: on a database pool every query is a POST; the database refuses writes.
    if (key === null || key.access === 'write' || pool.backend !== 'http') return null;
    const refused = judge(pool, ex.method, ex);
    if (refused !== null) return refused;
    const h = ex.headers;
    for (const name of METHOD_OVERRIDE_HEADERS) {
      const v = h[name];
      if (v === undefined) continue;
      // Repeated headers were joined with ", ": whichever one the origin reads, it must be admitted; one is enough to refuse.
      for (const m of v.split(',')) {
        const r = judge(pool, m.trim().toUpperCase(), ex);
        if (r !== null) return r;
      }
    }
    // Only a query that could name the parameter (`method` in any case, or an escape) is parsed.
    if (ex.query !== '' && MAY_NAME.test(ex.query)) return paramsRefusal(pool, ex, ex.query);
    return null;
  };
}

const MAY_NAME = /method|%/i;
const FORM = /^\s*application\/x-www-form-urlencoded/i;
const MULTIPART = /^\s*multipart\/form-data/i;

/** A parameter name as PHP (Laravel, Symfony) and Rack read it: decoded, leading spaces dropped, ' ', '.' and '[' read as '_'. */
function overrideParam(raw: string): boolean {
  let name = raw;
  try {
    name = decodeURIComponent(raw.replace(/\+/g, ' '));
  } catch {
    // A broken escape: judged as sent.
  }
  name = name.trimStart().replace(/^[ .[]/, '_').toLowerCase();
  return name === '_method' || name.startsWith('_method[');
}

function decodeValue(raw: string): string {
  try {
    return decodeURIComponent(raw.replace(/\+/g, ' '));
  } catch {
    return raw;
  }
}

/** The refusal when a `_method` parameter of `text` (a query or an urlencoded form) names a method the key may not send. */
function paramsRefusal(pool: PoolEntry, ex: Exchange, text: string): Reply | null {
  for (const pair of text.split(/[&;]/)) {
    const eq = pair.indexOf('=');
    if (!overrideParam(eq === -1 ? pair : pair.slice(0, eq))) continue;
    const r = judge(pool, decodeValue(eq === -1 ? '' : pair.slice(eq + 1)).trim().toUpperCase(), ex);
    if (r !== null) return r;
  }
  return null;
}

const PART_NAME = /content-disposition:[^\r\n]*?[;\s]name\s*=\s*(?:"([^"]*)"|([^;\s]*))[^\r\n]*\r?\n/gi;

/** The refusal when a multipart form's `_method` part names a method the key may not send. */
function partsRefusal(pool: PoolEntry, ex: Exchange, text: string): Reply | null {
  for (const m of text.matchAll(PART_NAME)) {
    if (!overrideParam(m[1] ?? m[2] ?? '')) continue;
    // The part's value: after its header block, up to the next boundary line.
    const start = text.indexOf('\r\n\r\n', m.index);
    if (start === -1) return FORBIDDEN;
    const end = text.indexOf('\r\n--', start + 4);
    const r = judge(pool, text.slice(start + 4, end === -1 ? undefined : end).trim().toUpperCase(), ex);
    if (r !== null) return r;
  }
  return null;
}

/**
 * A read key's request with a form body: the body must be read whole and judged (formOverrideRefusal) before a
 * slot is taken, since a `_method` field in it overrides the method.
 */
export function needsFormJudgement(ex: Exchange): boolean {
  const key = ex.key;
  if (key === null || key.access === 'write' || ex.pool!.backend !== 'http') return false;
  const type = ex.headers['content-type'];
  return type !== undefined && (FORM.test(type) || MULTIPART.test(type));
}

/** A read key's form body judged for `_method` (needsFormJudgement), as the override headers are judged. */
export function formOverrideRefusal(ex: Exchange, body: Buffer): Reply | null {
  const type = ex.headers['content-type']!;
  const text = body.toString('latin1');
  if (!MAY_NAME.test(text)) return null;
  return MULTIPART.test(type) ? partsRefusal(ex.pool!, ex, text) : paramsRefusal(ex.pool!, ex, text);
}
