// The in-memory lease registry (one node): leases by slotId, and a janitor that reclaims a lease one
// term after its last grant or renewal. Deadlines sit in a min-heap; one timer is armed for the earliest.
import { randomBytes } from 'node:crypto';
import type { Admission, AdmitRequest, Governor, Outcome, Permit } from '../governor/governor.js';
import { DeadlineHeap, type DeadlineEntry } from './deadline-heap.js';
import type { Lease, LeaseAdmission, LeaseRegistry, LeaseTerms, RenewResult } from './lease-registry.js';

/** setTimeout's largest delay. */
const MAX_TIMER_MS = 2_147_483_647;
/** Stale heap entries (from renewals) are dropped once they outnumber live leases by this factor. */
const COMPACT_FACTOR = 4;
const COMPACT_MIN = 4096;

export interface MemoryLeaseRegistryOptions {
  /** Grants the slots (the same instance proxy traffic uses, so both share one limit). */
  governor: Governor;
  /** Unix ms; tests may pass their own. */
  clock?: () => number;
  /** Called after a lease was reclaimed (no renewal within one term). */
  onReclaim?: (lease: Lease) => void;
}

class HeldLease implements Lease {
  readonly slotId: string;
  readonly poolId: number;
  readonly grantedAt: number;
  leaseDeadline: number;
  readonly requestDeadline: number;
  readonly termMs: number;
  readonly permit: Permit;

  constructor(slotId: string, permit: Permit, terms: LeaseTerms, now: number) {
    this.slotId = slotId;
    this.poolId = permit.poolId;
    this.grantedAt = now;
    this.termMs = terms.termMs;
    this.requestDeadline = now + terms.requestTimeoutMs;
    this.leaseDeadline = Math.min(now + terms.termMs, this.requestDeadline);
    this.permit = permit;
  }
}

/** 128 random bits, URL-safe: a slotId cannot be guessed, so holding it is the right to renew and release. */
export function newSlotId(): string {
  return randomBytes(16).toString('base64url');
}

/**
 * Every state change is one synchronous step on the event loop: a lease is in `#leases` exactly while
 * its permit is unsettled, and leaving the map always settles the permit (release, reclaim or close).
 * The heap may hold stale entries (a renewed lease's older deadline, a released lease); an entry counts
 * only while its lease is still held with that very deadline.
 */
export class MemoryLeaseRegistry implements LeaseRegistry {
  readonly #governor: Governor;
  readonly #clock: () => number;
  readonly #onReclaim: ((lease: Lease) => void) | null;
  readonly #leases = new Map<string, HeldLease>();
  readonly #perPool = new Map<number, number>();
  readonly #deadlines = new DeadlineHeap<HeldLease>();
  #timer: NodeJS.Timeout | null = null;
  #armedAt = Infinity;
  #closed = false;

  constructor(opts: MemoryLeaseRegistryOptions) {
    this.#governor = opts.governor;
    this.#clock = opts.clock ?? Date.now;
    this.#onReclaim = opts.onReclaim ?? null;
  }

  acquire(req: AdmitRequest, terms: LeaseTerms): LeaseAdmission | Promise<LeaseAdmission> {
    if (this.#closed) return { ok: false, reason: 'unavailable', queuedMs: 0 };
    const a = this.#governor.acquire(req);
    if (a instanceof Promise) return a.then((x) => this.#hold(x, terms));
    return this.#hold(a, terms);
  }

  /** Turns a granted permit into a held lease; a refusal passes through. */
  #hold(a: Admission, terms: LeaseTerms): LeaseAdmission {
    if (!a.ok) return a;
    if (this.#closed) {
      // Granted while shutting down: nobody will renew it.
      a.permit.release({ dropped: true });
      return { ok: false, reason: 'unavailable', queuedMs: a.queuedMs, queued: a.queued };
    }
    let slotId = newSlotId();
    while (this.#leases.has(slotId)) slotId = newSlotId();
    const lease = new HeldLease(slotId, a.permit, terms, this.#clock());
    this.#leases.set(slotId, lease);
    this.#perPool.set(lease.poolId, (this.#perPool.get(lease.poolId) ?? 0) + 1);
    this.#watch(lease);
    return { ok: true, lease, queuedMs: a.queuedMs, queued: a.queued };
  }

  renew(poolId: number, slotId: string): RenewResult {
    const lease = this.#held(poolId, slotId);
    if (lease === null) return { ok: false, reason: 'not_found' };
    if (lease.leaseDeadline >= lease.requestDeadline) return { ok: false, reason: 'capped' };
    lease.leaseDeadline = Math.min(this.#clock() + lease.termMs, lease.requestDeadline);
    this.#watch(lease);
    return { ok: true, leaseDeadline: lease.leaseDeadline };
  }

  release(poolId: number, slotId: string, outcome: Outcome): boolean {
    const lease = this.#held(poolId, slotId);
    if (lease === null) return false;
    this.#drop(lease);
    lease.permit.release(outcome);
    return true;
  }

  held(poolId?: number): number {
    return poolId === undefined ? this.#leases.size : (this.#perPool.get(poolId) ?? 0);
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    for (const lease of [...this.#leases.values()]) {
      this.#drop(lease);
      lease.permit.release({ dropped: true });
    }
  }

  /** The lease of this pool, if held and within its term; an overdue one is reclaimed on the spot. */
  #held(poolId: number, slotId: string): HeldLease | null {
    const lease = this.#leases.get(slotId);
    if (lease === undefined || lease.poolId !== poolId) return null;
    // The janitor's timer may run a moment late: past its deadline a lease is reclaimed, whoever asks first.
    if (this.#clock() >= lease.leaseDeadline) {
      this.#reclaim(lease);
      return null;
    }
    return lease;
  }

  #drop(lease: HeldLease): void {
    this.#leases.delete(lease.slotId);
    const n = (this.#perPool.get(lease.poolId) ?? 1) - 1;
    if (n === 0) this.#perPool.delete(lease.poolId);
    else this.#perPool.set(lease.poolId, n);
  }

  #reclaim(lease: HeldLease): void {
    this.#drop(lease);
    // No renewal within a term: the caller crashed or lost track; its hold time is not a latency sample.
    lease.permit.release({ dropped: true });
    this.#onReclaim?.(lease);
  }

  #watch(lease: HeldLease): void {
    this.#deadlines.push(lease.leaseDeadline, lease);
    if (this.#deadlines.size > COMPACT_MIN && this.#deadlines.size > COMPACT_FACTOR * this.#leases.size) {
      this.#deadlines.compact((e) => this.#live(e));
    }
    if (lease.leaseDeadline < this.#armedAt) this.#arm(lease.leaseDeadline);
  }

  #live(e: DeadlineEntry<HeldLease>): boolean {
    return this.#leases.get(e.item.slotId) === e.item && e.item.leaseDeadline === e.at;
  }

  #arm(at: number): void {
    if (this.#closed) return;
    if (this.#timer) clearTimeout(this.#timer);
    this.#armedAt = at;
    this.#timer = setTimeout(() => this.#sweep(), Math.min(MAX_TIMER_MS, Math.max(0, at - this.#clock())));
    this.#timer.unref();
  }

  /** Reclaims every lease whose deadline has passed, then arms the timer for the next live deadline. */
  #sweep(): void {
    this.#timer = null;
    this.#armedAt = Infinity;
    const now = this.#clock();
    for (let e = this.#deadlines.peek(); e !== undefined; e = this.#deadlines.peek()) {
      if (!this.#live(e)) {
        this.#deadlines.pop();
        continue;
      }
      if (e.at > now) {
        this.#arm(e.at);
        return;
      }
      this.#deadlines.pop();
      this.#reclaim(e.item);
    }
  }
}
