// Stage 2, authenticate: the pool key from X-Service-Key, or `Authorization: Bearer <key>` where the
// pool allows it. Keys are looked up by SHA-256 hash in the snapshot; expiry is checked on the clock.
import { sha256Hex } from '../security/tokens.js';
import { reply, type Exchange, type Stage, type Reply } from './exchange.js';
import type { KeyEntry } from './snapshot.js';

const UNAUTHORIZED: Reply = reply(401, 'unauthorized', 'missing or invalid pool key');
const BEARER = /^bearer[ \t]+(\S+)[ \t]*$/i;

/** The key behind a SHA-256 hash when it admits to this pool now (not another pool's, not expired), else null. */
export function liveKey(keys: ReadonlyMap<string, KeyEntry>, hash: string, poolId: number, now: number): KeyEntry | null {
  const key = keys.get(hash);
  return key !== undefined && key.poolId === poolId && (key.expiresAt === null || key.expiresAt > now) ? key : null;
}

export function authenticateStage(clock: () => number): Stage {
  return (ex: Exchange) => {
    const pool = ex.pool!;
    let presented = ex.headers['x-service-key'] || null;
    let fromAuthorization = false;
    if (presented === null && pool.settings.allowBearerKey) {
      const m = BEARER.exec(ex.headers.authorization ?? '');
      if (m) {
        presented = m[1]!;
        fromAuthorization = true;
      }
    }
    if (presented === null) {
      // A pool that does not require a key admits anonymous traffic (and forwards Authorization as is).
      return pool.requireKey ? UNAUTHORIZED : null;
    }
    // The hash lookup is the comparison: a map hit on a SHA-256 digest leaks nothing usable about the key.
    const key = liveKey(ex.snapshot.keys, sha256Hex(presented), pool.id, clock());
    if (key === null) {
      // A Bearer token that is not a pool key of an open pool is the origin's own auth: pass it through.
      if (fromAuthorization && !pool.requireKey) return null;
      return UNAUTHORIZED;
    }
    ex.key = key;
    ex.keyInAuthorization = fromAuthorization;
    return null;
  };
}
