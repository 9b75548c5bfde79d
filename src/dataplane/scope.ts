// Stage 3, scope: a `read` key admits GET, HEAD, OPTIONS and the pool's extra read methods (optionally
// limited to path prefixes); any other method is refused here, before the origin and before a slot.
import { reply, type Exchange, type Gate, type Reply } from './exchange.js';

const FORBIDDEN: Reply = reply(403, 'forbidden', 'this key is read-only and does not admit this method or path');
const BASE = new Set(['GET', 'HEAD', 'OPTIONS']);
/** A `.` or `..` segment, raw or percent-encoded: the origin may resolve it out of the allowed prefix. */
const DOT_SEGMENT = /(^|\/)(\.|%2e){1,2}(\/|$)/i;

export function scopeGate(): Gate {
  return (ex: Exchange) => {
    const key = ex.key;
    const pool = ex.pool!;
    // Spec, key access semantics 3: on a database pool every query is a POST; the database refuses writes.
    if (key === null || key.access === 'write' || pool.backend !== 'http') return null;
    if (!pool.readMethods.has(ex.method)) return FORBIDDEN;
    if (BASE.has(ex.method)) return null;
    const prefixes = pool.readPaths.get(ex.method);
    if (prefixes === undefined) return null;
    if (DOT_SEGMENT.test(ex.path)) return FORBIDDEN;
    for (const p of prefixes) if (ex.path.startsWith(p)) return null;
    return FORBIDDEN;
  };
}
