// The in-memory governor (one node): per-pool concurrency slots, a bounded FIFO wait queue per pool,
// Capacity budgets whose pools share one origin cap, and per pool an adaptive limit and an RPM gate.
import {
  abortedAlready,
  waitSignal,
  type Admission,
  type AdmitRequest,
  type BudgetLimits,
  type Governor,
  type Outcome,
  type PoolLimits,
  type PoolState,
  type RefusalReason,
} from './governor.js';
import { EMPTY_STATE, nextAdaptive, sanitizeLimits } from './pool-limits.js';
import type { AdaptiveLimit } from './adaptive-limit.js';
import { BudgetShare } from './budget-share.js';
import { learnedState, learnOutcome, type LearnedState } from './outcome-learning.js';
import * as rules from './admission-rules.js';
import type { SlotState } from './admission-rules.js';
import { RpmLearner } from './rpm-learner.js';
import { SlotPermit } from './slot-permit.js';
import { WaitQueue, type WaitNode } from './wait-queue.js';
import { MAX_TIMER_MS, SYSTEM_TIME, timeFrom, type GovernorTime, type GovernorTimers } from './clock.js';

export { MAX_TIMER_MS, NODE_TIMERS, type GovernorTimers } from './clock.js';

/** Time and randomness (defaults: the system's); tests and simulations pass fake ones. */
export type MemoryGovernorOptions = Partial<GovernorTime>;

export type { LearnedState } from './outcome-learning.js';

/** One waiter; it is also its own abort listener (handleEvent), so no listener closure is made per waiter. */
class Waiter implements WaitNode<Waiter> {
  prev: Waiter | null = null;
  next: Waiter | null = null;
  linked = false;
  timer: unknown = null;
  readonly pool: PoolSlots;
  readonly seq: number;
  readonly enqueuedAt: number;
  readonly signal: AbortSignal | undefined;
  readonly #resolve: (a: Admission) => void;

  constructor(pool: PoolSlots, seq: number, signal: AbortSignal | undefined, resolve: (a: Admission) => void) {
    this.pool = pool;
    this.seq = seq;
    this.enqueuedAt = pool.now();
    this.signal = signal;
    this.#resolve = resolve;
  }

  handleEvent(): void {
    this.pool.refuse(this, 'aborted');
  }

  /** Detaches the timer and the abort listener, then answers the caller. Called once, after unlinking. */
  settle(a: Admission): void {
    if (this.timer !== null) this.pool.timers.clearTimeout(this.timer);
    this.timer = null;
    this.signal?.removeEventListener('abort', this);
    this.#resolve(a);
  }
}

function onWaitTimeout(w: Waiter): void {
  w.pool.refuse(w, 'queue_timeout');
}

/** The slots, queue and limits of one pool: a store of slot state under the admission rules. */
class PoolSlots implements SlotState {
  readonly poolId: number;
  readonly now: () => number;
  readonly wallClock: () => number;
  readonly timers: GovernorTimers;
  limits!: PoolLimits;
  inFlight = 0;
  readonly queue = new WaitQueue<Waiter>();
  budget: BudgetShare<PoolSlots> | null = null;
  /** False once the pool left the configuration: refuses new work, lets its permits drain. */
  active = true;
  avgHoldMs = 0;
  /** The adaptive limit; null while `adaptive` is off (a pool switched back on starts afresh). */
  adaptive: AdaptiveLimit | null = null;
  readonly rpm = new RpmLearner();
  /** Wakes the queue when the RPM gate reopens; armed only while waiters are held back by the gate. */
  gateTimer: unknown = null;

  constructor(limits: PoolLimits, now: () => number, wallClock: () => number, timers: GovernorTimers) {
    this.poolId = limits.poolId;
    this.now = now;
    this.wallClock = wallClock;
    this.timers = timers;
    this.setLimits(limits);
  }

  setLimits(limits: PoolLimits): void {
    this.limits = limits;
    this.adaptive = nextAdaptive(this.adaptive, limits);
    this.rpm.setOverride(limits.rpmOverride ?? null, this.now());
  }

  get reservedConcurrent(): number {
    return this.limits.reservedConcurrent;
  }

  get queued(): number {
    return this.queue.size;
  }

  get queueLength(): number {
    return this.limits.queueLength;
  }

  get queueTimeoutMs(): number {
    return this.limits.queueTimeoutMs;
  }

  effectiveLimit(): number {
    if (!this.active) return 0;
    // The controller's bounds are adaptiveMin..max_concurrent, so its limit is already the minimum.
    return this.adaptive === null ? this.limits.maxConcurrent : this.adaptive.limit;
  }

  rpmAllows(now: number): boolean {
    return this.rpm.allows(now);
  }

  rpmWaitMs(now: number): number {
    return this.rpm.waitMs(now);
  }

  rpmTake(now: number): void {
    this.rpm.take(now);
  }

  headSeq(): number {
    return this.queue.peek()!.seq;
  }

  grantHead(now: number): void {
    this.grant(this.queue.peek()!, now);
  }

  gateOpened(): void {
    rules.pump(this, this.now);
  }

  /** Counts a slot and makes its permit. */
  take(now: number, queuedMs: number, queued: boolean): Admission {
    rules.take(this, now);
    return { ok: true, permit: new SlotPermit(this, now), queuedMs, queued };
  }

  give(grantedAt: number, outcome: Outcome | undefined): void {
    if (this.inFlight === 0) return; // unreachable while permits settle once; never go negative
    const now = this.now();
    const held = now - grantedAt;
    // Learn before the slot is counted free: the sample's in-flight includes itself, and a raised
    // limit admits waiters in the pump below. The wall clock dates rate-limit headers only (a clock read
    // per release saved for the wire listeners, which report none).
    if (outcome !== undefined) learnOutcome(outcome, held, now, outcome.headers !== undefined ? this.wallClock() : 0, this.rpm, this.adaptive, this.inFlight);
    rules.give(this);
    rules.noteHold(this, held);
    rules.pump(this, this.now);
  }

  enqueue(w: Waiter, waitMs: number): void {
    this.queue.push(w);
    if (this.budget) this.budget.waiting++;
    w.timer = this.timers.setTimeout(onWaitTimeout, Math.min(waitMs, MAX_TIMER_MS), w);
    w.signal?.addEventListener('abort', w);
    rules.armGate(this, this.now());
  }

  #unlink(w: Waiter): boolean {
    if (!this.queue.remove(w)) return false;
    if (this.budget) this.budget.waiting--;
    return true;
  }

  /** Hands a slot straight to a waiter (no wake-up race: the slot is counted before the answer). */
  grant(w: Waiter, now: number): void {
    this.#unlink(w);
    w.settle(this.take(now, now - w.enqueuedAt, true));
  }

  refuse(w: Waiter, reason: RefusalReason): void {
    if (!this.#unlink(w)) return;
    const queuedMs = this.now() - w.enqueuedAt;
    w.settle(reason === 'queue_timeout' ? { ok: false, reason, queuedMs, retryAfterMs: rules.retryAfterMs(this), queued: true } : { ok: false, reason, queuedMs, queued: true });
  }

  refuseAll(reason: RefusalReason): void {
    rules.disarmGate(this);
    for (let w = this.queue.peek(); w !== null; w = this.queue.peek()) this.refuse(w, reason);
  }
}

/**
 * Admission for one node. A free slot is granted synchronously (no promise, two small objects); otherwise
 * the caller waits in its pool's FIFO until a release hands it the slot directly, its wait ends
 * (`queue_timeout`) or its signal aborts (`aborted`). Everything runs on the event loop, so counts and
 * queues need no locks: each take/give and each queue move is one synchronous step.
 */
export class MemoryGovernor implements Governor {
  readonly #now: () => number;
  readonly #wallClock: () => number;
  readonly #timers: GovernorTimers;
  readonly #pools = new Map<number, PoolSlots>();
  #seq = 0;
  #closed = false;

  constructor(opts: MemoryGovernorOptions = {}) {
    const time = timeFrom(opts, SYSTEM_TIME);
    this.#now = time.now;
    this.#wallClock = time.wallClock;
    this.#timers = time.timers;
  }

  configure(pools: readonly PoolLimits[], budgets: readonly BudgetLimits[]): void {
    const seen = new Set<number>();
    for (const raw of pools) {
      const limits = sanitizeLimits(raw);
      seen.add(limits.poolId);
      const p = this.#pools.get(limits.poolId);
      if (p) {
        p.setLimits(limits);
        p.active = true;
      } else {
        this.#pools.set(limits.poolId, new PoolSlots(limits, this.#now, this.#wallClock, this.#timers));
      }
    }
    for (const [id, p] of this.#pools) {
      if (seen.has(id)) continue;
      p.active = false;
      p.budget = null;
      p.refuseAll('unavailable');
      // Kept while its permits drain, so a pool that comes back keeps counting them.
      if (p.inFlight === 0) this.#pools.delete(id);
    }

    // Budgets are rebuilt from scratch; only a capped budget shares anything.
    const shares = new Map<number, BudgetShare<PoolSlots>>();
    for (const b of budgets) {
      if (b.originMaxConcurrent !== null) shares.set(b.budgetId, new BudgetShare(b.budgetId, Math.max(0, Math.floor(b.originMaxConcurrent))));
    }
    for (const p of this.#pools.values()) {
      if (!p.active) continue;
      const share = p.limits.budgetId === null ? undefined : shares.get(p.limits.budgetId);
      p.budget = share ?? null;
      share?.members.push(p);
    }
    for (const share of shares.values()) share.recount((p) => p.queue.size);

    // Raised limits admit waiters at once.
    for (const p of this.#pools.values()) if (p.active) rules.pump(p, this.#now);
  }

  acquire(req: AdmitRequest): Admission | Promise<Admission> {
    const p = this.#pools.get(req.poolId);
    if (p === undefined || !p.active || this.#closed) return { ok: false, reason: 'unavailable', queuedMs: 0 };
    if (abortedAlready(req)) return { ok: false, reason: 'aborted', queuedMs: 0 };
    const now = this.#now();
    const d = rules.decide(p, req.waitMs, now);
    if (d === rules.TAKE) return p.take(now, 0, false);
    if (typeof d !== 'number') return d;
    const waitMs = d;
    const seq = ++this.#seq;
    return new Promise<Admission>((resolve) => p.enqueue(new Waiter(p, seq, waitSignal(req), resolve), waitMs));
  }

  state(poolId: number): PoolState {
    const p = this.#pools.get(poolId);
    if (p === undefined) return EMPTY_STATE;
    return { inFlight: p.inFlight, queued: p.queue.size, effectiveLimit: p.effectiveLimit(), remaining: rules.remaining(p, this.#now()) };
  }

  /** What the pool's adaptive limit and RPM learner know; null for an unknown pool. */
  learned(poolId: number): LearnedState | null {
    const p = this.#pools.get(poolId);
    if (p === undefined) return null;
    return learnedState(p.adaptive, p.rpm, p.rpm.waitMs(this.#now()));
  }

  async close(): Promise<void> {
    this.#closed = true;
    for (const p of this.#pools.values()) p.refuseAll('unavailable');
  }
}
