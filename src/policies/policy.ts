// What a pool policy sees of a request, and its refusal. Policies run after key auth and method scope,
// before a slot is taken; a refusal is a value (never an exception) counted by pool, policy and reason.
import type { KeyEntry, PoolEntry } from '../pool-request/snapshot.js';

/** `settings`: the pool's policy settings cannot be applied (only after a hand edit of the row). */
export type PolicyName = 'ip_allowlist' | 'access_proxy' | 'hmac' | 'jwt' | 'settings';

export interface PolicyRequest {
  readonly pool: PoolEntry;
  /** The authenticated pool key; null when the pool admits without one. */
  readonly key: KeyEntry | null;
  /** The pool key came in Authorization (so a JWT cannot). */
  readonly keyInAuthorization: boolean;
  readonly method: string;
  /** Path as sent, without the query. */
  readonly path: string;
  /** Raw query without `?`, or ''. */
  readonly query: string;
  /** Lower-case names; repeated headers joined with ", ". */
  readonly headers: Readonly<Record<string, string>>;
  /** The TCP peer (socket) address. */
  readonly peer: string;
  /** The client address: the peer, or the forwarded one when the peer is a trusted proxy. */
  readonly client: string;
}

export interface PolicyRefusal {
  /** 401 (identity not proven), 403 (not allowed from here), 413 (signed body too large), 503 (cannot check now). */
  readonly status: 401 | 403 | 413 | 503;
  readonly policy: PolicyName;
  /** Stable, low-cardinality reason (the metric label). */
  readonly reason: string;
  readonly message: string;
}

export type Verdict = PolicyRefusal | null;

export interface Policy {
  readonly name: PolicyName;
  /** `body` is the whole request body when the pool's policies need it (HMAC), else null. */
  check(req: PolicyRequest, body: Buffer | null): Verdict | Promise<Verdict>;
}

export const refuse = (status: PolicyRefusal['status'], policy: PolicyName, reason: string, message: string): PolicyRefusal => ({
  status,
  policy,
  reason,
  message,
});
