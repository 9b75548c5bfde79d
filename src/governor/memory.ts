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
import { EMPTY_STATE, sanitizeLimits } from './limits.js';
import { AdaptiveLimit } from './adaptive-limit.js';
import { BudgetShare } from './budget-share.js';
import { gateRetryHintMs, learnOutcome, nextAvgHold, retryHintMs } from './outcome-learning.js';
import { RpmLearner } from './rpm-learner.js';
import { SlotPermit } from './slot-permit.js';
import { WaitQueue, type WaitNode } from './wait-queue.js';

/** setTimeout's largest delay; a longer wait would fire at once. */
export const MAX_TIMER_MS = 2_147_483_647;

/** The timer functions the governor uses; a simulation passes its own with simulated time. */
export interface GovernorTimers {
  setTimeout<T>(fn: (arg: T) => void, ms: number, arg: T): unknown;
  clearTimeout(handle: unknown): void;
}

export const NODE_TIMERS: GovernorTimers = {
  setTimeout: (fn, ms, arg) => setTimeout(fn, ms, arg),
  clearTimeout: (handle) => clearTimeout(handle as NodeJS.Timeout),
};

export interface MemoryGovernorOptions {
  /** Monotonic clock in ms; tests pass a fake one. */
  now?: () => number;
  /** Wall-clock time in epoch ms, for dates in rate-limit headers (default Date.now). */
  wallClock?: () => number;
  /** Timers for waits and the RPM gate (default Node's); must follow the same clock as `now`. */
  timers?: GovernorTimers;
}

/** What the adaptive limit and the RPM learner of one pool know (for tests, benchmarks and diagnostics). */
export interface LearnedState {
  /** The learned adaptive limit (whole slots within adaptiveMin..max_concurrent, not lowered by a probe); null when adaptive is off. */
  adaptiveLimit: number | null;
  shortRttMs: number;
  longRttMs: number;
  /** Requests per minute the upstream stated; null until it said. */
  learnedRpm: number | null;
  /** The rate the gate enforces per minute (override, or a margin under the learned figure); null when none. */
  gateRpm: number | null;
  tokenLimit: number | null;
  /** Ms until the gate lets the next request through; 0 when open. */
  gateWaitMs: number;
}

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

function onGateOpen(p: PoolSlots): void {
  p.gateTimer = null;
  p.pump();
}

/** The slots, queue and limits of one pool. Every change of `inFlight` goes through take() and give(). */
class PoolSlots {
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
  #avgHoldMs = 0;
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
    const min = Math.min(limits.adaptiveMin ?? 1, limits.maxConcurrent);
    if (!limits.adaptive || limits.maxConcurrent === 0) this.adaptive = null;
    else if (this.adaptive === null) this.adaptive = new AdaptiveLimit({ min, max: limits.maxConcurrent });
    else this.adaptive.setBounds(min, limits.maxConcurrent);
    this.rpm.setOverride(limits.rpmOverride ?? null, this.now());
  }

  get reservedConcurrent(): number {
    return this.limits.reservedConcurrent;
  }

  /** The one place the effective limit is computed: min(max_concurrent, adaptive). */
  effectiveLimit(): number {
    if (!this.active) return 0;
    // The controller's bounds are adaptiveMin..max_concurrent, so its limit is already the minimum.
    return this.adaptive === null ? this.limits.maxConcurrent : this.adaptive.limit;
  }

  canTake(): boolean {
    return this.inFlight < this.effectiveLimit() && (this.budget === null || this.budget.admits(this)) && this.rpm.allows(this.now());
  }

  /** Ms until the RPM gate lets a request through (0 when open). */
  gateWaitMs(): number {
    return this.rpm.waitMs(this.now());
  }

  /** Arms the wake-up for waiters the RPM gate holds back (nothing else would wake them). */
  armGate(): void {
    if (this.gateTimer !== null || this.queue.size === 0 || !this.active) return;
    const wait = this.gateWaitMs();
    if (wait > 0) this.gateTimer = this.timers.setTimeout(onGateOpen, Math.min(Math.ceil(wait), MAX_TIMER_MS), this);
  }

  disarmGate(): void {
    if (this.gateTimer !== null) this.timers.clearTimeout(this.gateTimer);
    this.gateTimer = null;
  }

  remaining(): number {
    // A shut RPM gate takes nothing now, whatever slots are free.
    if (!this.rpm.allows(this.now())) return 0;
    const own = Math.max(0, this.effectiveLimit() - this.inFlight);
    return this.budget === null ? own : Math.min(own, this.budget.headroom(this));
  }

  take(queuedMs: number, queued: boolean): Admission {
    const now = this.now();
    this.budget?.take(this);
    this.inFlight++;
    this.rpm.take(now);
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
    this.budget?.give(this);
    this.inFlight--;
    this.#avgHoldMs = nextAvgHold(this.#avgHoldMs, held);
    this.pump();
  }

  enqueue(w: Waiter, waitMs: number): void {
    this.queue.push(w);
    if (this.budget) this.budget.waiting++;
    w.timer = this.timers.setTimeout(onWaitTimeout, Math.min(waitMs, MAX_TIMER_MS), w);
    w.signal?.addEventListener('abort', w);
    this.armGate();
  }

  #unlink(w: Waiter): boolean {
    if (!this.queue.remove(w)) return false;
    if (this.budget) this.budget.waiting--;
    return true;
  }

  /** Hands a slot straight to a waiter (no wake-up race: the slot is counted before the answer). */
  grant(w: Waiter): void {
    this.#unlink(w);
    w.settle(this.take(this.now() - w.enqueuedAt, true));
  }

  refuse(w: Waiter, reason: RefusalReason): void {
    if (!this.#unlink(w)) return;
    const queuedMs = this.now() - w.enqueuedAt;
    w.settle(reason === 'queue_timeout' ? { ok: false, reason, queuedMs, retryAfterMs: this.retryAfterMs(), queued: true } : { ok: false, reason, queuedMs, queued: true });
  }

  refuseAll(reason: RefusalReason): void {
    this.disarmGate();
    for (let w = this.queue.peek(); w !== null; w = this.queue.peek()) this.refuse(w, reason);
  }

  /** Admits waiters while capacity allows: the pool's own FIFO, or the budget's when it shares one. */
  pump(): void {
    if (this.budget !== null) {
      pumpBudget(this.budget);
      return;
    }
    for (let w = this.queue.peek(); w !== null && this.canTake(); w = this.queue.peek()) this.grant(w);
    this.armGate();
  }

  /** When a slot may free, in whole seconds (see retryHintMs). */
  retryAfterMs(): number {
    return retryHintMs(this.#avgHoldMs, this.queue.size, this.effectiveLimit());
  }
}

/**
 * A slot freed (or limits changed) in a budget: admit the oldest waiter, across all of the budget's pools,
 * whose pool may take a slot now; repeat until none may. Oldest-first by arrival is the fairness rule.
 */
function pumpBudget(b: BudgetShare<PoolSlots>): void {
  while (b.waiting > 0) {
    let best: Waiter | null = null;
    for (const p of b.members) {
      const head = p.queue.peek();
      if (head !== null && (best === null || head.seq < best.seq) && p.canTake()) best = head;
    }
    if (best === null) break;
    best.pool.grant(best);
  }
  if (b.waiting > 0) for (const p of b.members) p.armGate();
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
    this.#now = opts.now ?? (() => performance.now());
    this.#wallClock = opts.wallClock ?? Date.now;
    this.#timers = opts.timers ?? NODE_TIMERS;
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
    for (const p of this.#pools.values()) if (p.active) p.pump();
  }

  acquire(req: AdmitRequest): Admission | Promise<Admission> {
    const p = this.#pools.get(req.poolId);
    if (p === undefined || !p.active || this.#closed) return { ok: false, reason: 'unavailable', queuedMs: 0 };
    if (abortedAlready(req)) return { ok: false, reason: 'aborted', queuedMs: 0 };
    // An empty queue check first: a newcomer never overtakes a waiter of its own pool.
    if (p.queue.size === 0 && p.canTake()) return p.take(0, false);

    const waitMs = Math.min(req.waitMs, p.limits.queueTimeoutMs);
    // The RPM gate: refused at once, like a full pool, when it will not open within the wait.
    const gateWait = p.gateWaitMs();
    if (gateWait > 0 && !(gateWait <= waitMs)) return { ok: false, reason: 'rate_limited', queuedMs: 0, retryAfterMs: gateRetryHintMs(gateWait) };
    if (!(waitMs > 0)) return { ok: false, reason: 'no_slot', queuedMs: 0, retryAfterMs: p.retryAfterMs() };
    if (p.queue.size >= p.limits.queueLength) return { ok: false, reason: 'queue_full', queuedMs: 0, retryAfterMs: p.retryAfterMs() };
    const seq = ++this.#seq;
    return new Promise<Admission>((resolve) => p.enqueue(new Waiter(p, seq, waitSignal(req), resolve), waitMs));
  }

  state(poolId: number): PoolState {
    const p = this.#pools.get(poolId);
    if (p === undefined) return EMPTY_STATE;
    return { inFlight: p.inFlight, queued: p.queue.size, effectiveLimit: p.effectiveLimit(), remaining: p.remaining() };
  }

  /** What the pool's adaptive limit and RPM learner know; null for an unknown pool. */
  learned(poolId: number): LearnedState | null {
    const p = this.#pools.get(poolId);
    if (p === undefined) return null;
    const orNull = (n: number): number | null => (Number.isNaN(n) ? null : n);
    return {
      adaptiveLimit: p.adaptive === null ? null : Math.floor(p.adaptive.estimate),
      shortRttMs: p.adaptive?.shortRtt ?? 0,
      longRttMs: p.adaptive?.longRtt ?? 0,
      learnedRpm: orNull(p.rpm.learnedRpm),
      gateRpm: orNull(p.rpm.gateRpm),
      tokenLimit: orNull(p.rpm.tokenLimit),
      gateWaitMs: p.gateWaitMs(),
    };
  }

  async close(): Promise<void> {
    this.#closed = true;
    for (const p of this.#pools.values()) p.refuseAll('unavailable');
  }
}
