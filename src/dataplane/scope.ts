// Stage 3, scope: a `read` key admits GET, HEAD, OPTIONS and the pool's extra read methods (optionally
// limited to path prefixes); any other method is refused here, before the origin and before a slot.
// A method-override header (X-HTTP-Method-Override and kin) is judged as the method it names: many
// frameworks honour it, so a read key's GET that says DELETE is a DELETE.
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
    return null;
  };
}
