// The lease registry: which lock slots are held, until when, and the permit behind each. The lock API
// speaks only to this interface, so a registry kept in Redis (shared by every dataplane node) can replace
// the in-memory one without touching the routes.
import type { Admission, AdmitRequest, Outcome } from '../governor/governor.js';

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

/** The pool's lease settings for one acquire. */
export interface LeaseTerms {
  termMs: number;
  /** The pool's request timeout: requestDeadline = grant time + this. */
  requestTimeoutMs: number;
}

/** The governor's answer to a lock acquire: a held lease, or its refusal as is. */
export type LeaseAdmission = { ok: true; lease: Lease; queuedMs: number; queued: boolean } | Extract<Admission, { ok: false }>;

export type RenewResult =
  | { ok: true; leaseDeadline: number }
  /** not_found: released, reclaimed, never existed, or another pool's slot; capped: the lease reached requestDeadline. */
  | { ok: false; reason: 'not_found' | 'capped' };

/**
 * Holds leases and reclaims those not renewed within their term. Methods may answer synchronously (memory)
 * or with a promise (a remote store); callers treat both alike.
 */
export interface LeaseRegistry {
  /**
   * Asks the governor for a slot (waiting as `req` says) and holds it as a lease with a fresh unguessable
   * slotId. Acquisition and lease are one step, so a store that keeps leases itself (Redis: a member of the
   * pool's slot set scored by its deadline) never holds a slot that has no lease.
   */
  acquire(req: AdmitRequest, terms: LeaseTerms): LeaseAdmission | Promise<LeaseAdmission>;
  /** Extends a held lease of `poolId` by one term, never beyond its requestDeadline. */
  renew(poolId: number, slotId: string): RenewResult | Promise<RenewResult>;
  /**
   * Frees a held lease of `poolId` with the caller's outcome; false when it was already gone. `terms` (the
   * pool's) let a registry shared by nodes time a lease granted elsewhere.
   */
  release(poolId: number, slotId: string, outcome: Outcome, terms?: LeaseTerms): boolean | Promise<boolean>;
  /** Leases held now (all pools, or one). */
  held(poolId?: number): number;
  /** Stops reclaiming and settles every held permit (as dropped work). */
  close(): Promise<void>;
}
