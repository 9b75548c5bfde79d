// The Redis lease registry (many dataplane nodes): a lock slot is a lease in Redis with its request-timeout
// cap stored beside it, so a slot taken on one node is renewed, capped, released or reclaimed alike on all.
import type { AdmitRequest, Outcome } from '../governor/governor.js';
import type { RedisGovernor } from '../governor/redis.js';
import type { LeaseAdmission, LeaseRegistry, LeaseTerms, RenewResult } from './lease-registry.js';
import { newSlotId } from './memory-leases.js';

/** Expired entries of `#local` are dropped every this many grants. */
const PRUNE_EVERY = 1024;

export class RedisLeaseRegistry implements LeaseRegistry {
  readonly #governor: RedisGovernor;
  /**
   * Leases granted through this node and not seen ending through it: slotId → pool and request deadline
   * (Redis clock), after which the lease cannot exist. Entries past it are pruned, so abandoned leases do
   * not pile up here.
   */
  readonly #local = new Map<string, { poolId: number; until: number; grantedAt: number }>();
  #grants = 0;
  #closed = false;

  constructor(governor: RedisGovernor) {
    this.#governor = governor;
  }

  async acquire(req: AdmitRequest, terms: LeaseTerms): Promise<LeaseAdmission> {
    if (this.#closed) return { ok: false, reason: 'unavailable', queuedMs: 0 };
    const slotId = newSlotId();
    const a = await this.#governor.acquireLease({ ...req, termMs: terms.termMs, requestTimeoutMs: terms.requestTimeoutMs, leaseId: slotId });
    if (!a.ok) return a;
    const { lease } = a;
    const termMs = Math.max(1, Math.floor(terms.termMs));
    const requestDeadline = lease.requestDeadline!;
    if (++this.#grants % PRUNE_EVERY === 0) this.#prune(lease.deadline - termMs);
    this.#local.set(slotId, { poolId: lease.poolId, until: requestDeadline, grantedAt: performance.now() });
    return {
      ok: true,
      queuedMs: a.queuedMs,
      queued: a.queued,
      lease: {
        slotId,
        poolId: lease.poolId,
        // Redis's clock: the grant is one (capped) term before the first deadline.
        grantedAt: lease.deadline - Math.min(termMs, Math.max(1, Math.floor(terms.requestTimeoutMs))),
        leaseDeadline: lease.deadline,
        requestDeadline,
        termMs,
      },
    };
  }

  /** Rejects while Redis is unreachable (the lock API answers 503). */
  async renew(poolId: number, slotId: string): Promise<RenewResult> {
    const r = await this.#governor.renewCappedLease(poolId, slotId);
    if (!r.ok && r.reason === 'not_found') this.#local.delete(slotId);
    return r;
  }

  /**
   * Rejects while Redis is unreachable (the lock API answers 503; the lease then ends with its term).
   * The outcome feeds this node's RPM learner and adaptive limit, which share what they learn via Redis.
   */
  async release(poolId: number, slotId: string, outcome: Outcome, terms?: LeaseTerms): Promise<boolean> {
    // The hold time: this node's clock when it granted the lease, else Redis's (from the lease's cap and the
    // pool's request timeout).
    const mine = this.#local.get(slotId);
    const report = mine !== undefined && outcome.latencyMs === undefined ? { ...outcome, latencyMs: performance.now() - mine.grantedAt } : outcome;
    const released = await this.#governor.releaseLease(poolId, slotId, report, terms?.requestTimeoutMs);
    this.#local.delete(slotId);
    return released;
  }

  /** This node's view only: leases it granted that it has not seen end (other nodes' releases are not seen). */
  held(poolId?: number): number {
    this.#prune(Date.now());
    if (poolId === undefined) return this.#local.size;
    let n = 0;
    for (const e of this.#local.values()) if (e.poolId === poolId) n++;
    return n;
  }

  /**
   * Leases outlive this node: a client may renew or release them on any other node, and an abandoned one
   * ends with its term. Closing only stops granting.
   */
  async close(): Promise<void> {
    this.#closed = true;
    this.#local.clear();
  }

  #prune(now: number): void {
    for (const [id, e] of this.#local) if (e.until <= now) this.#local.delete(id);
  }
}
