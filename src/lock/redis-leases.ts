// The Redis lease registry (many dataplane nodes): a lock slot is a lease in Redis with its request-timeout
// cap stored beside it, so a slot taken on one node is renewed, capped, released or reclaimed alike on all.
import type { AdmitRequest, Outcome } from '../governor/governor.js';
import { backendDown, type RedisGovernor } from '../governor/redis.js';
import { LEASE_END, RENEW_CAPPED } from './redis-lease-scripts.js';
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
    governor.useScripts([RENEW_CAPPED, LEASE_END]);
  }

  async acquire(req: AdmitRequest, terms: LeaseTerms): Promise<LeaseAdmission> {
    if (this.#closed) return { ok: false, reason: 'unavailable', queuedMs: 0 };
    const slotId = newSlotId();
    const termMs = Math.max(1, Math.floor(terms.termMs));
    const cap = Math.max(1, Math.floor(terms.requestTimeoutMs));
    // The first term never runs past the cap either.
    const firstTerm = Math.min(termMs, cap);
    const a = await this.#governor.acquireLease({ ...req, termMs: firstTerm, leaseId: slotId });
    if (!a.ok) return a;
    const { lease } = a;
    // Granted at deadline − firstTerm on the Redis clock; the cap is kept beside the lease so that every node
    // renews it the same way (RENEW_CAPPED). It expires one term after the cap, when the lease is gone.
    const requestDeadline = lease.deadline - firstTerm + cap;
    try {
      await this.#governor.redis.set(lease.key, `${requestDeadline}:${termMs}`, 'PXAT', requestDeadline + termMs);
    } catch {
      this.#governor.dropLease(lease.poolId, slotId);
      return backendDown() as LeaseAdmission;
    }
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
        grantedAt: lease.deadline - firstTerm,
        leaseDeadline: lease.deadline,
        requestDeadline,
        termMs,
      },
    };
  }

  /** Rejects while Redis is unreachable (the lock API answers 503). */
  async renew(poolId: number, slotId: string): Promise<RenewResult> {
    const r = await this.#renewCapped(poolId, slotId);
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
    const released = await this.#end(poolId, slotId, report, terms?.requestTimeoutMs);
    this.#local.delete(slotId);
    return released;
  }

  /**
   * One term more, from any node, never past the request deadline stored with the lease. Redis reclaims a
   * lease past its deadline here, whoever asks first.
   */
  async #renewCapped(poolId: number, slotId: string): Promise<RenewResult> {
    const keys = this.#governor.leaseKeys(poolId);
    if (!keys) return { ok: false, reason: 'not_found' };
    const [r, d] = (await this.#governor.runScript(RENEW_CAPPED, [keys.slots, keys.lease + slotId], [slotId])) as [number, number];
    if (r === 1) return { ok: true, leaseDeadline: d };
    return { ok: false, reason: r === -1 ? 'capped' : 'not_found' };
  }

  /**
   * Frees a lease from any node, its cap with it. A lease's hold time is not known on a node that did not
   * grant it: given the pool's `requestTimeoutMs`, it is taken on Redis's clock from the lease's cap (granted
   * at requestDeadline − requestTimeoutMs), in the round trip that deletes the cap anyway, and fed to the
   * adaptive limit like a local one.
   */
  #end(poolId: number, slotId: string, outcome: Outcome, requestTimeoutMs?: number): Promise<boolean> {
    const keys = this.#governor.leaseKeys(poolId);
    if (!keys) return Promise.resolve(false);
    const end = this.#governor.runScript(LEASE_END, [keys.lease + slotId], []) as Promise<[number, number]>;
    if (outcome.latencyMs === undefined && requestTimeoutMs !== undefined) {
      end.then(
        ([requestDeadline, now]) => {
          const latencyMs = requestDeadline > 0 ? Math.max(0, now - (requestDeadline - requestTimeoutMs)) : undefined;
          this.#governor.learnLease(poolId, latencyMs === undefined ? outcome : { ...outcome, latencyMs });
        },
        () => {},
      );
    } else {
      end.catch(() => {});
      this.#governor.learnLease(poolId, outcome);
    }
    return this.#governor.releaseLease(poolId, slotId);
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
