// The lock API's paths: /pools/{pool}/lock/acquire and /pools/{pool}/lock/{slotId}/(renew|release).
// Anything else on the lock listener is 404.

export type LockAction = 'acquire' | 'renew' | 'release';

export interface LockRoute {
  action: LockAction;
  /** The pool subdomain label, lower-cased. */
  pool: string;
  /** Null for acquire. */
  slotId: string | null;
}

/** A subdomain label (what pool naming can produce) and a slotId (base64url, bounded). */
const LABEL = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
const SLOT = /^[A-Za-z0-9_-]{1,64}$/;

export function matchLockRoute(path: string): LockRoute | null {
  // Tolerate one trailing slash; nothing else is normalised (no dot segments, no percent-decoding).
  const parts = (path.endsWith('/') ? path.slice(0, -1) : path).split('/');
  if (parts[0] !== '' || parts[1] !== 'pools' || parts[3] !== 'lock') return null;
  const pool = parts[2]!.toLowerCase();
  if (!LABEL.test(pool)) return null;
  if (parts.length === 5 && parts[4] === 'acquire') return { action: 'acquire', pool, slotId: null };
  if (parts.length === 6 && (parts[5] === 'renew' || parts[5] === 'release') && SLOT.test(parts[4]!)) {
    return { action: parts[5], pool, slotId: parts[4]! };
  }
  return null;
}
