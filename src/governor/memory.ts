// The in-memory governor (one node): per-pool concurrency slots, a bounded FIFO wait queue per pool, and
// Capacity budgets whose pools share one origin cap.
import type {
  Admission,
  AdmitRequest,
  BudgetLimits,
  Governor,
  Outcome,
  Permit,
  PoolLimits,
  PoolState,
  RefusalReason,
} from './governor.js';
import { BudgetShare } from './budget-share.js';
import { WaitQueue, type WaitNode } from './wait-queue.js';

/** setTimeout's largest delay; a longer wait would fire at once. */
const MAX_TIMER_MS = 2_147_483_647;
/** Weight of the newest hold time in the moving average behind the retry hint. */
const HOLD_WEIGHT = 0.1;
/** The retry hint is whole seconds (Retry-After has second granularity), within these bounds. */
const RETRY_MIN_MS = 1_000;
const RETRY_MAX_MS = 60_000;
/** Hold time assumed before a pool has released anything. */
const DEFAULT_HOLD_MS = 1_000;

export interface MemoryGovernorOptions {
  /** Monotonic clock in ms; tests pass a fake one. */
  now?: () => number;
}

/** One waiter; it is also its own abort listener (handleEvent), so no listener closure is made per waiter. */
class Waiter implements WaitNode<Waiter> {
  prev: Waiter | null = null;
  next: Waiter | null = null;
  linked = false;
  timer: NodeJS.Timeout | null = null;
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
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.signal?.removeEventListener('abort', this);
    this.#resolve(a);
  }
}

function onWaitTimeout(w: Waiter): void {
  w.pool.refuse(w, 'queue_timeout');
}

/** A granted slot; settled once (the first release counts). */
class SlotPermit implements Permit {
  readonly poolId: number;
  readonly #pool: PoolSlots;
  readonly #grantedAt: number;
  #released = false;

  constructor(pool: PoolSlots, grantedAt: number) {
    this.#pool = pool;
    this.poolId = pool.poolId;
    this.#grantedAt = grantedAt;
  }

  release(_outcome?: Outcome): void {
    if (this.#released) return;
    this.#released = true;
    // The outcome will feed the adaptive limit; the hold time already feeds the retry hint.
    this.#pool.give(this.#grantedAt);
  }
}

/** The slots, queue and limits of one pool. Every change of `inFlight` goes through take() and give(). */
class PoolSlots {
  readonly poolId: number;
  readonly now: () => number;
  limits: PoolLimits;
  inFlight = 0;
  readonly queue = new WaitQueue<Waiter>();
  budget: BudgetShare<PoolSlots> | null = null;
  /** False once the pool left the configuration: refuses new work, lets its permits drain. */
  active = true;
  #avgHoldMs = 0;

  constructor(limits: PoolLimits, now: () => number) {
    this.poolId = limits.poolId;
    this.limits = limits;
    this.now = now;
  }

  get reservedConcurrent(): number {
    return this.limits.reservedConcurrent;
  }

  /** The one place the effective limit is computed; the adaptive limit will join as min(max, adaptive). */
  effectiveLimit(): number {
    return this.active ? this.limits.maxConcurrent : 0;
  }

  canTake(): boolean {
    return this.inFlight < this.effectiveLimit() && (this.budget === null || this.budget.admits(this));
  }

  remaining(): number {
    const own = Math.max(0, this.effectiveLimit() - this.inFlight);
    return this.budget === null ? own : Math.min(own, this.budget.headroom(this));
  }

  take(queuedMs: number): Admission {
    this.budget?.take(this);
    this.inFlight++;
    return { ok: true, permit: new SlotPermit(this, this.now()), queuedMs };
  }

  give(grantedAt: number): void {
    if (this.inFlight === 0) return; // unreachable while permits settle once; never go negative
    this.budget?.give(this);
    this.inFlight--;
    const held = this.now() - grantedAt;
    this.#avgHoldMs = this.#avgHoldMs === 0 ? held : this.#avgHoldMs + HOLD_WEIGHT * (held - this.#avgHoldMs);
    this.pump();
  }

  enqueue(w: Waiter, waitMs: number): void {
    this.queue.push(w);
    if (this.budget) this.budget.waiting++;
    w.timer = setTimeout(onWaitTimeout, Math.min(waitMs, MAX_TIMER_MS), w);
    w.signal?.addEventListener('abort', w);
  }

  #unlink(w: Waiter): boolean {
    if (!this.queue.remove(w)) return false;
    if (this.budget) this.budget.waiting--;
    return true;
  }

  /** Hands a slot straight to a waiter (no wake-up race: the slot is counted before the answer). */
  grant(w: Waiter): void {
    this.#unlink(w);
    w.settle(this.take(this.now() - w.enqueuedAt));
  }

  refuse(w: Waiter, reason: RefusalReason): void {
    if (!this.#unlink(w)) return;
    const queuedMs = this.now() - w.enqueuedAt;
    w.settle(reason === 'queue_timeout' ? { ok: false, reason, queuedMs, retryAfterMs: this.retryAfterMs() } : { ok: false, reason, queuedMs });
  }

  refuseAll(reason: RefusalReason): void {
    for (let w = this.queue.peek(); w !== null; w = this.queue.peek()) this.refuse(w, reason);
  }

  /** Admits waiters while capacity allows: the pool's own FIFO, or the budget's when it shares one. */
  pump(): void {
    if (this.budget !== null) {
      pumpBudget(this.budget);
      return;
    }
    for (let w = this.queue.peek(); w !== null && this.canTake(); w = this.queue.peek()) this.grant(w);
  }

  /**
   * Seconds-granular hint for when a slot may free: the average hold time times the waiters ahead
   * (plus this caller), spread over the pool's slots.
   */
  retryAfterMs(): number {
    const hold = this.#avgHoldMs > 0 ? this.#avgHoldMs : DEFAULT_HOLD_MS;
    const ms = (hold * (this.queue.size + 1)) / Math.max(1, this.effectiveLimit());
    return Math.min(RETRY_MAX_MS, Math.max(RETRY_MIN_MS, Math.ceil(ms / 1000) * 1000));
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
    if (best === null) return;
    best.pool.grant(best);
  }
}

function sanitize(l: PoolLimits): PoolLimits {
  const count = (n: number): number => (Number.isFinite(n) && n > 0 ? Math.floor(n) : 0);
  return {
    poolId: l.poolId,
    maxConcurrent: count(l.maxConcurrent),
    queueLength: count(l.queueLength),
    queueTimeoutMs: count(l.queueTimeoutMs),
    budgetId: l.budgetId,
    reservedConcurrent: count(l.reservedConcurrent),
  };
}

const EMPTY_STATE: PoolState = Object.freeze({ inFlight: 0, queued: 0, effectiveLimit: 0, remaining: 0 });

/**
 * Admission for one node. A free slot is granted synchronously (no promise, two small objects); otherwise
 * the caller waits in its pool's FIFO until a release hands it the slot directly, its wait ends
 * (`queue_timeout`) or its signal aborts (`aborted`). Everything runs on the event loop, so counts and
 * queues need no locks: each take/give and each queue move is one synchronous step.
 */
export class MemoryGovernor implements Governor {
  readonly #now: () => number;
  readonly #pools = new Map<number, PoolSlots>();
  #seq = 0;
  #closed = false;

  constructor(opts: MemoryGovernorOptions = {}) {
    this.#now = opts.now ?? (() => performance.now());
  }

  configure(pools: readonly PoolLimits[], budgets: readonly BudgetLimits[]): void {
    const seen = new Set<number>();
    for (const raw of pools) {
      const limits = sanitize(raw);
      seen.add(limits.poolId);
      const p = this.#pools.get(limits.poolId);
      if (p) {
        p.limits = limits;
        p.active = true;
      } else {
        this.#pools.set(limits.poolId, new PoolSlots(limits, this.#now));
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
    const signal = req.signal;
    if (signal?.aborted) return { ok: false, reason: 'aborted', queuedMs: 0 };
    // An empty queue check first: a newcomer never overtakes a waiter of its own pool.
    if (p.queue.size === 0 && p.canTake()) return p.take(0);

    const waitMs = Math.min(req.waitMs, p.limits.queueTimeoutMs);
    if (!(waitMs > 0)) return { ok: false, reason: 'no_slot', queuedMs: 0, retryAfterMs: p.retryAfterMs() };
    if (p.queue.size >= p.limits.queueLength) return { ok: false, reason: 'queue_full', queuedMs: 0, retryAfterMs: p.retryAfterMs() };
    const seq = ++this.#seq;
    return new Promise<Admission>((resolve) => p.enqueue(new Waiter(p, seq, signal, resolve), waitMs));
  }

  state(poolId: number): PoolState {
    const p = this.#pools.get(poolId);
    if (p === undefined) return EMPTY_STATE;
    return { inFlight: p.inFlight, queued: p.queue.size, effectiveLimit: p.effectiveLimit(), remaining: p.remaining() };
  }

  async close(): Promise<void> {
    this.#closed = true;
    for (const p of this.#pools.values()) p.refuseAll('unavailable');
  }
}
