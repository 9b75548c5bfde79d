// The lease registry: which lock slots are held, until when, and the permit behind each. The lock API
// speaks only to this interface, so a registry kept in Redis (shared by every dataplane node) can replace
// the in-memory one without touching the routes.
import type { Outcome, Permit } from '../governor/governor.js';

/** One held lock slot (spec: Lock grant). Deadlines are Unix milliseconds. */
export interface Lease {
  readonly slotId: string;
  readonly poolId: number;
  readonly grantedAt: number;
  readonly leaseDeadline: number;
  /** The request-timeout cap: renewal never extends the lease beyond it. */
  readonly requestDeadline: number;
  readonly termMs: number;
}

export interface LeaseGrant {
  poolId: number;
  /** The governor's permit; the registry settles it exactly once (release or reclaim). */
  permit: Permit;
  termMs: number;
  /** The pool's request timeout: requestDeadline = grant time + this. */
  requestTimeoutMs: number;
}

export type RenewResult =
  | { ok: true; leaseDeadline: number }
  /** not_found: released, reclaimed, never existed, or another pool's slot; capped: the lease reached requestDeadline. */
  | { ok: false; reason: 'not_found' | 'capped' };

/**
 * Holds leases and reclaims those not renewed within their term. Methods may answer synchronously (memory)
 * or with a promise (a remote store); callers treat both alike.
 */
export interface LeaseRegistry {
  /** Records a granted permit as a held lease with a fresh unguessable slotId. */
  open(grant: LeaseGrant): Lease | Promise<Lease>;
  /** Extends a held lease of `poolId` by one term, never beyond its requestDeadline. */
  renew(poolId: number, slotId: string): RenewResult | Promise<RenewResult>;
  /** Frees a held lease of `poolId` with the caller's outcome; false when it was already gone. */
  release(poolId: number, slotId: string, outcome: Outcome): boolean | Promise<boolean>;
  /** Leases held now (all pools, or one). */
  held(poolId?: number): number;
  /** Stops reclaiming and settles every held permit (as dropped work). */
  close(): Promise<void>;
}
