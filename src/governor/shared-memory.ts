// The shared-memory governor: the memory governor's slots, FIFO queues, budgets, adaptive limit and RPM
// gate kept in one SharedArrayBuffer, so the data plane's worker threads admit against the same limits.
import { abortedAlready, waitSignal, type Admission, type AdmitRequest, type BudgetLimits, type Governor, type Outcome, type PoolLimits, type PoolState, type RefusalReason } from './governor.js';
import type { MemoryGovernorOptions } from './memory.js';
import { MAX_TIMER_MS, PROCESS_TIME, timeFrom, type GovernorTimers } from './clock.js';
import { AdaptiveLimit } from './adaptive-limit.js';
import { BudgetShare } from './budget-share.js';
import { EMPTY_STATE, sanitizeLimits } from './pool-limits.js';
import { applyOutcome, learnedState, readOutcome, type LearnedState } from './outcome-learning.js';
import * as rules from './admission-rules.js';
import type { SlotState } from './admission-rules.js';
import { RpmLearner } from './rpm-learner.js';
import { SlotPermit } from './slot-permit.js';
import { lockWord, unlockWord } from './shared-lock.js';
import {
  B_USED,
  C_CLOSED,
  C_FREE,
  C_LOCK,
  C_OWNER,
  C_VERSION,
  CN_SEQ,
  DEFAULT_SIZES,
  E_ANSWERED,
  E_FREE,
  E_NEXT,
  E_POOL,
  E_PREV,
  E_QUEUED,
  E_RESULT,
  E_STATE,
  E_THREAD,
  NONE,
  P_ACTIVE,
  P_ADAPTIVE,
  P_BUDGET,
  P_DRAINING,
  P_HEAD,
  P_IN_FLIGHT,
  P_MAX,
  P_QUEUE_LENGTH,
  P_QUEUE_TIMEOUT,
  P_QUEUED,
  P_RESERVED,
  P_STATE,
  P_TAIL,
  P_UNUSED,
  PN_AVG_HOLD,
  PN_ID,
  R_GRANTED,
  R_UNAVAILABLE,
  SharedLayout,
  type SharedGovernorHandle,
  type SharedSizes,
  T_ATTACHED,
  T_DOORBELL,
  T_FREE,
  T_GEN,
  T_HANDED,
  T_HEAD,
  T_STATE,
  T_TAIL,
} from './shared-memory-layout.js';

export type { SharedGovernorHandle, SharedSizes } from './shared-memory-layout.js';

/** Atomics.waitAsync (Node 20 has it; TypeScript's ES2022 lib does not name it yet). */
const waitAsync = (Atomics as unknown as {
  waitAsync(a: Int32Array, i: number, v: number): { async: false; value: string } | { async: true; value: Promise<string> };
}).waitAsync;

export interface SharedMemoryGovernorOptions extends MemoryGovernorOptions {
  /** Capacities of the shared buffer (main thread only; workers take them from the handle). */
  sizes?: Partial<SharedSizes>;
}

/** One waiter of this thread; its entry in shared memory is `entry`. Also its own abort listener. */
class Waiter {
  timer: unknown = null;
  readonly gov: SharedMemoryGovernor;
  readonly entry: number;
  readonly pool: PoolView;
  readonly enqueuedAt: number;
  readonly signal: AbortSignal | undefined;
  readonly resolve: (a: Admission) => void;

  constructor(gov: SharedMemoryGovernor, entry: number, pool: PoolView, enqueuedAt: number, signal: AbortSignal | undefined, resolve: (a: Admission) => void) {
    this.gov = gov;
    this.entry = entry;
    this.pool = pool;
    this.enqueuedAt = enqueuedAt;
    this.signal = signal;
    this.resolve = resolve;
  }

  handleEvent(): void {
    this.gov.leave(this, 'aborted');
  }
}

function onWaitTimeout(w: Waiter): void {
  w.gov.leave(w, 'queue_timeout');
}

/**
 * This thread's handle on one pool row of the shared buffer: reads its counts there, and holds views of
 * its budget, adaptive limit and RPM learner (whose state is in the buffer too). Built once per row. A
 * store of slot state under the admission rules; every use is under the buffer's lock.
 */
class PoolView implements SlotState {
  readonly gov: SharedMemoryGovernor;
  readonly row: number;
  readonly timers: GovernorTimers;
  readonly #pools: Int32Array;
  readonly #base: number;
  readonly #nums: Float64Array;
  readonly #avgHold: number;
  readonly #seq: Float64Array;
  poolId = 0;
  budget: BudgetShare<PoolView> | null = null;
  readonly adaptive: AdaptiveLimit;
  readonly rpm: RpmLearner;
  /** This thread's wake-up for waiters the RPM gate holds back. */
  gateTimer: unknown = null;

  constructor(gov: SharedMemoryGovernor, l: SharedLayout, row: number, timers: GovernorTimers) {
    this.gov = gov;
    this.row = row;
    this.timers = timers;
    this.#pools = l.pools;
    this.#base = l.pool(row);
    this.#nums = l.poolNums;
    this.#avgHold = l.poolNum(row) + PN_AVG_HOLD;
    this.#seq = l.entrySeq;
    // Attached, not initialised: the main thread's configure() sets the state up.
    this.adaptive = new AdaptiveLimit({ min: 1, max: 1 }, l.adaptiveStore(row), false);
    this.rpm = new RpmLearner({}, l.rpmStore(row), false);
  }

  /** A permit's release (always in the thread that holds it). */
  give(grantedAt: number, outcome: Outcome | undefined): void {
    this.gov.give(this, grantedAt, outcome);
  }

  get inFlight(): number {
    return this.#pools[this.#base + P_IN_FLIGHT]!;
  }

  set inFlight(n: number) {
    this.#pools[this.#base + P_IN_FLIGHT] = n;
  }

  get queued(): number {
    return this.#pools[this.#base + P_QUEUED]!;
  }

  get queueLength(): number {
    return this.#pools[this.#base + P_QUEUE_LENGTH]!;
  }

  get queueTimeoutMs(): number {
    return this.#pools[this.#base + P_QUEUE_TIMEOUT]!;
  }

  get avgHoldMs(): number {
    return this.#nums[this.#avgHold]!;
  }

  set avgHoldMs(ms: number) {
    this.#nums[this.#avgHold] = ms;
  }

  get active(): boolean {
    return this.#pools[this.#base + P_STATE] === P_ACTIVE && !this.gov.closed;
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
    return this.#seq[this.#pools[this.#base + P_HEAD]!]!;
  }

  grantHead(now: number): void {
    this.gov.grant(this, this.#pools[this.#base + P_HEAD]!, now);
  }

  gateOpened(): void {
    this.gov.pumpPool(this);
  }

  get reservedConcurrent(): number {
    return this.#pools[this.#base + P_RESERVED]!;
  }

  field(f: number): number {
    return this.#pools[this.#base + f]!;
  }

  set(f: number, v: number): void {
    this.#pools[this.#base + f] = v;
  }

  /** min(max_concurrent, adaptive); 0 once the pool left the configuration. */
  effectiveLimit(): number {
    if (this.field(P_STATE) !== P_ACTIVE) return 0;
    return this.field(P_ADAPTIVE) === 1 ? this.adaptive.limit : this.field(P_MAX);
  }
}

/**
 * Admission shared by the threads of one process. The main thread makes it (`new`), configures it on
 * every snapshot, and hands each worker a `handle()`; a worker `attach()`es and acquires, releases and
 * reads state against the same counts. Every step on shared state runs under one short lock in the
 * buffer, so the memory governor's rules hold across threads: a free slot is granted synchronously, a
 * newcomer never overtakes a waiter of its pool in any thread, a release hands its slot to the oldest
 * waiter (by arrival, across the budget's pools) and rings that waiter's thread, and a waiter that
 * timed out or aborted after its slot was handed over takes the grant (then releases it) instead.
 * Release outcomes from every thread feed the one adaptive limit and RPM gate kept in the buffer.
 */
export class SharedMemoryGovernor implements Governor {
  readonly #l: SharedLayout;
  readonly #thread: number;
  readonly #threadBase: number;
  readonly #main: boolean;
  #gen: number;
  readonly #now: () => number;
  readonly #wallClock: () => number;
  readonly #timers: GovernorTimers;
  /** The pool map as of configure version `#version`: pool id → row. */
  #version = -1;
  readonly #rows = new Map<number, number>();
  readonly #views: (PoolView | undefined)[] = [];
  /** This thread's waiters by entry. */
  readonly #waiters = new Map<number, Waiter>();
  /** Threads to ring after the lock is released (marks dedupe). */
  readonly #ring: number[] = [];
  readonly #ringMark: Uint8Array;
  #listening = false;
  #closed = false;

  /** The main thread's governor; pass `handle` (through SharedMemoryGovernor.attach) to join one from a worker. */
  constructor(opts: SharedMemoryGovernorOptions = {}, handle?: SharedGovernorHandle) {
    // The default clock is the process's: every thread must read the same time for the shared state.
    const time = timeFrom(opts, PROCESS_TIME);
    this.#now = time.now;
    this.#wallClock = time.wallClock;
    this.#timers = time.timers;
    if (handle === undefined) {
      const sizes = { ...DEFAULT_SIZES, ...opts.sizes };
      for (const k of ['maxPools', 'maxWaiters', 'maxThreads'] as const) {
        if (!Number.isInteger(sizes[k]) || sizes[k] < 1) throw new RangeError(`sizes.${k} must be a positive integer`);
      }
      this.#l = new SharedLayout(sizes);
      this.#main = true;
      this.#thread = 0;
    } else {
      this.#l = new SharedLayout(handle.sizes, handle.buffer);
      this.#main = false;
      this.#thread = handle.thread;
    }
    this.#threadBase = this.#l.thread(this.#thread);
    this.#ringMark = new Uint8Array(this.#l.sizes.maxThreads);
    const th = this.#l.threads;
    if (this.#main) th[this.#threadBase + T_STATE] = T_ATTACHED;
    else if (Atomics.compareExchange(th, this.#threadBase + T_STATE, T_HANDED, T_ATTACHED) !== T_HANDED) {
      throw new Error('this shared governor handle is not free: make one handle() per worker');
    }
    this.#gen = Atomics.load(th, this.#threadBase + T_GEN);
  }

  /** Joins the shared governor of `handle` (made by the main thread's `handle()`) from a worker thread. */
  static attach(handle: SharedGovernorHandle, opts: Omit<SharedMemoryGovernorOptions, 'sizes'> = {}): SharedMemoryGovernor {
    return new SharedMemoryGovernor(opts, handle);
  }

  /**
   * Reserves a thread slot and returns what a worker passes to `attach()` (structured-cloneable: send it
   * in workerData or postMessage). Main thread only. Call `reclaim(handle)` when that worker has exited.
   */
  handle(): SharedGovernorHandle {
    if (!this.#main) throw new Error('only the main thread hands out shared governor handles');
    const th = this.#l.threads;
    for (let t = 1; t < this.#l.sizes.maxThreads; t++) {
      if (Atomics.compareExchange(th, this.#l.thread(t) + T_STATE, T_FREE, T_HANDED) === T_FREE) {
        return { buffer: this.#l.buffer, sizes: this.#l.sizes, thread: t };
      }
    }
    throw new Error(`no free thread slot in the shared governor (maxThreads ${this.#l.sizes.maxThreads})`);
  }

  /**
   * A worker is gone (exited or crashed): gives back every slot it still held, drops its waiters and frees
   * its thread slot for a new handle. Permits still alive in that worker then release nothing.
   */
  reclaim(handle: SharedGovernorHandle): void {
    if (!this.#main || handle.thread === 0 || handle.buffer !== this.#l.buffer) return;
    const l = this.#l;
    const t = handle.thread;
    const tb = l.thread(t);
    // A worker terminated inside a step (worker.terminate() stops it anywhere) leaves the lock held: free it.
    // That step's counts may be half-written; a worker that closes its governor before it exits never does this.
    if (l.ctl[C_OWNER] === t + 1 && Atomics.load(l.ctl, C_LOCK) !== 0) {
      l.ctl[C_OWNER] = 0;
      Atomics.store(l.ctl, C_LOCK, 0);
      Atomics.notify(l.ctl, C_LOCK);
    }
    this.#lock();
    try {
      if (l.threads[tb + T_STATE] === T_FREE) return;
      this.#sync();
      l.threads[tb + T_GEN]!++;
      // Its queued waiters leave; answered ones are dropped (a granted slot is in its holdings below).
      for (let e = 0; e < l.sizes.maxWaiters; e++) {
        const eb = l.entry(e);
        if (l.entries[eb + E_STATE] === E_QUEUED && l.entries[eb + E_THREAD] === t) {
          this.#unlink(this.#views[l.entries[eb + E_POOL]!]!, e);
          this.#freeEntry(e);
        }
      }
      for (let e = l.threads[tb + T_HEAD]!; e !== NONE; ) {
        const next = l.entries[l.entry(e) + E_NEXT]!;
        this.#freeEntry(e);
        e = next;
      }
      l.threads[tb + T_HEAD] = l.threads[tb + T_TAIL] = NONE;
      for (const row of this.#rows.values()) {
        const v = this.#views[row]!;
        for (let n = l.holdings[t * l.sizes.maxPools + row]!; n > 0; n--) this.#giveBack(v, t);
      }
      Atomics.store(l.threads, tb + T_STATE, T_FREE);
    } finally {
      this.#unlock();
    }
    this.#ringThreads();
  }

  configure(pools: readonly PoolLimits[], budgets: readonly BudgetLimits[]): void {
    // The main thread is the one authority: a worker's pools come through shared memory.
    if (!this.#main) return;
    const l = this.#l;
    this.#lock();
    try {
      this.#sync();
      const now = this.#now();
      const listed = new Set<number>();
      for (const raw of pools) listed.add(raw.poolId);
      // Pools that left first, so that their rows are free for new pools.
      for (const [id, row] of this.#rows) {
        if (listed.has(id)) continue;
        const v = this.#views[row]!;
        v.set(P_STATE, P_DRAINING);
        v.set(P_BUDGET, NONE);
        v.budget = null;
        this.#refuseAll(v);
        // Kept while its permits drain, so a pool that comes back keeps counting them.
        if (v.inFlight === 0) {
          v.set(P_STATE, P_UNUSED);
          this.#rows.delete(id);
        }
      }
      const seen = new Set<number>();
      for (const raw of pools) {
        const limits = sanitizeLimits(raw);
        if (seen.has(limits.poolId)) continue;
        let row = this.#rows.get(limits.poolId);
        if (row === undefined) {
          row = this.#newRow(limits.poolId, now);
          // Beyond maxPools a pool is not admitted (unavailable); documented in the decisions.
          if (row === NONE) continue;
        }
        seen.add(limits.poolId);
        this.#setLimits(this.#views[row]!, limits, now);
      }
      this.#setBudgets(pools, budgets);
      Atomics.add(l.ctl, C_VERSION, 1);
      this.#sync();
      // Raised limits admit waiters at once.
      for (const row of this.#rows.values()) {
        const v = this.#views[row]!;
        if (v.field(P_STATE) === P_ACTIVE) rules.pump(v, this.#now);
      }
    } finally {
      this.#unlock();
    }
    this.#ringThreads();
  }

  acquire(req: AdmitRequest): Admission | Promise<Admission> {
    if (this.#closed) return { ok: false, reason: 'unavailable', queuedMs: 0 };
    const l = this.#l;
    let v: PoolView;
    let entry: number;
    let now: number;
    let waitMs: number;
    this.#lock();
    try {
      this.#sync();
      const row = this.#rows.get(req.poolId);
      if (row === undefined || l.ctl[C_CLOSED] === 1) return { ok: false, reason: 'unavailable', queuedMs: 0 };
      v = this.#views[row]!;
      if (v.field(P_STATE) !== P_ACTIVE) return { ok: false, reason: 'unavailable', queuedMs: 0 };
      if (abortedAlready(req)) return { ok: false, reason: 'aborted', queuedMs: 0 };
      now = this.#now();
      // The same rules in every thread: a newcomer never overtakes a waiter of its pool in any thread.
      const d = rules.decide(v, req.waitMs, now);
      if (d === rules.TAKE) {
        this.#take(v, this.#thread, now);
        return { ok: true, permit: new SlotPermit(v, now), queuedMs: 0, queued: false };
      }
      if (typeof d !== 'number') return d;
      waitMs = d;
      entry = this.#allocEntry();
      // A full entry table counts as a full queue (maxWaiters is documented).
      if (entry === NONE) return rules.refuse(v, 'queue_full');
      this.#enqueue(v, entry);
    } finally {
      this.#unlock();
    }
    const signal = waitSignal(req);
    const promise = new Promise<Admission>((resolve) => {
      const w = new Waiter(this, entry, v, now, signal, resolve);
      this.#waiters.set(entry, w);
      w.timer = this.#timers.setTimeout(onWaitTimeout, Math.min(waitMs, MAX_TIMER_MS), w);
      signal?.addEventListener('abort', w);
    });
    this.#listen();
    return promise;
  }

  state(poolId: number): PoolState {
    this.#lock();
    try {
      this.#sync();
      const row = this.#rows.get(poolId);
      if (row === undefined) return EMPTY_STATE;
      const v = this.#views[row]!;
      return { inFlight: v.inFlight, queued: v.queued, effectiveLimit: v.effectiveLimit(), remaining: rules.remaining(v, this.#now()) };
    } finally {
      this.#unlock();
    }
  }

  /** What the pool's adaptive limit and RPM learner know (shared by every thread); null for an unknown pool. */
  learned(poolId: number): LearnedState | null {
    this.#lock();
    try {
      this.#sync();
      const row = this.#rows.get(poolId);
      if (row === undefined) return null;
      const v = this.#views[row]!;
      return learnedState(v.field(P_ADAPTIVE) === 1 ? v.adaptive : null, v.rpm, v.rpm.waitMs(this.#now()));
    } finally {
      this.#unlock();
    }
  }

  /**
   * Main thread: closes the shared governor for every thread (each waiter anywhere, and every later
   * acquire, is refused `unavailable`). Worker: detaches this thread only (its waiters are refused).
   * Permits taken before can still be released either way.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const l = this.#l;
    this.#lock();
    try {
      this.#sync();
      if (this.#main) {
        l.ctl[C_CLOSED] = 1;
        for (const row of this.#rows.values()) this.#refuseAll(this.#views[row]!);
      } else {
        for (const w of this.#waiters.values()) {
          if (l.entries[l.entry(w.entry) + E_STATE] === E_QUEUED) this.#answer(w.entry, R_UNAVAILABLE, w.pool);
        }
      }
      for (const row of this.#rows.values()) {
        const v = this.#views[row]!;
        rules.disarmGate(v);
      }
    } finally {
      this.#unlock();
    }
    this.#ringThreads();
    // This thread's own answers are settled now; a grant that raced the close is given back.
    this.#drain();
  }

  /** A waiter's wait ended (timeout or abort): it leaves its queue, unless its answer is already out. */
  leave(w: Waiter, reason: RefusalReason): void {
    const l = this.#l;
    let refusal: Admission | null = null;
    this.#lock();
    try {
      this.#sync();
      if (l.entries[l.entry(w.entry) + E_STATE] === E_QUEUED && this.#waiters.get(w.entry) === w) {
        this.#unlink(w.pool, w.entry);
        this.#freeEntry(w.entry);
        const queuedMs = this.#now() - w.enqueuedAt;
        refusal = reason === 'queue_timeout' ? { ok: false, reason, queuedMs, retryAfterMs: rules.retryAfterMs(w.pool), queued: true } : { ok: false, reason, queuedMs, queued: true };
      }
    } finally {
      this.#unlock();
    }
    if (refusal !== null) this.#settle(w, refusal);
    // Its slot was handed over (or refused) just before: take that answer, as the memory governor would have.
    else this.#drain();
  }

  /** A permit's release. */
  give(v: PoolView, grantedAt: number, outcome: Outcome | undefined): void {
    const l = this.#l;
    const now = this.#now();
    const held = now - grantedAt;
    // Headers are parsed before the lock: it is shared by every thread and must stay short.
    const kind = outcome !== undefined ? readOutcome(outcome, this.#wallClock()) : null;
    this.#lock();
    try {
      // The main thread reclaimed this thread's slots (it was taken for dead): nothing is held any more.
      if (l.threads[this.#threadBase + T_GEN] !== this.#gen) return;
      this.#sync();
      if (v.inFlight === 0) return; // unreachable while permits settle once; never go negative
      // Learn before the slot is counted free: the sample's in-flight includes itself, and a raised
      // limit admits waiters in the pump below.
      if (kind !== null) applyOutcome(kind, outcome!.latencyMs ?? held, now, v.rpm, v.field(P_ADAPTIVE) === 1 ? v.adaptive : null, v.inFlight);
      rules.noteHold(v, held);
      this.#giveBack(v, this.#thread);
    } finally {
      this.#unlock();
    }
    this.#ringThreads();
  }

  /** The RPM gate reopened: admits the pool's waiters (of any thread). */
  pumpPool(v: PoolView): void {
    this.#lock();
    try {
      this.#sync();
      if (v.field(P_STATE) === P_ACTIVE) rules.pump(v, this.#now);
    } finally {
      this.#unlock();
    }
    this.#ringThreads();
  }

  /** Whether this thread's governor is closed (its pools' waiters need no gate wake-up). */
  get closed(): boolean {
    return this.#closed;
  }

  /** Hands a slot straight to a queued entry (under the lock): counted for its thread before its thread is rung. */
  grant(v: PoolView, e: number, now: number): void {
    this.#take(v, this.#l.entries[this.#l.entry(e) + E_THREAD]!, now);
    this.#answer(e, R_GRANTED, v);
  }

  // ---- under the lock ----

  #lock(): void {
    lockWord(this.#l.ctl, C_LOCK);
    this.#l.ctl[C_OWNER] = this.#thread + 1;
  }

  #unlock(): void {
    this.#l.ctl[C_OWNER] = 0;
    unlockWord(this.#l.ctl, C_LOCK);
  }

  /** Brings this thread's pool map up to the last configure(). */
  #sync(): void {
    const l = this.#l;
    const version = l.ctl[C_VERSION]!;
    if (version === this.#version) return;
    this.#version = version;
    this.#rows.clear();
    const shares = new Map<number, BudgetShare<PoolView>>();
    for (let row = 0; row < l.sizes.maxPools; row++) {
      const state = l.pools[l.pool(row) + P_STATE];
      if (state === P_UNUSED) continue;
      const v = this.#view(row);
      this.#rows.set(v.poolId, row);
      const b = v.field(P_BUDGET);
      if (state !== P_ACTIVE || b === NONE) {
        v.budget = null;
        continue;
      }
      let share = shares.get(b);
      if (share === undefined) shares.set(b, (share = new BudgetShare<PoolView>(l.budgetIds[b]!, 0, l.shareStore(b), false)));
      share.members.push(v);
      v.budget = share;
    }
  }

  #view(row: number): PoolView {
    let v = this.#views[row];
    if (v === undefined) this.#views[row] = v = new PoolView(this, this.#l, row, this.#timers);
    v.poolId = this.#l.poolNums[this.#l.poolNum(row) + PN_ID]!;
    return v;
  }

  #newRow(poolId: number, now: number): number {
    const l = this.#l;
    for (let row = 0; row < l.sizes.maxPools; row++) {
      if (l.pools[l.pool(row) + P_STATE] !== P_UNUSED) continue;
      l.pools.fill(0, l.pool(row), l.pool(row + 1));
      l.pools[l.pool(row) + P_HEAD] = l.pools[l.pool(row) + P_TAIL] = NONE;
      l.pools[l.pool(row) + P_BUDGET] = NONE;
      l.poolNums[l.poolNum(row) + PN_ID] = poolId;
      l.poolNums[l.poolNum(row) + PN_AVG_HOLD] = 0;
      l.pools[l.pool(row) + P_STATE] = P_DRAINING; // made active by #setLimits
      for (let t = 0; t < l.sizes.maxThreads; t++) l.holdings[t * l.sizes.maxPools + row] = 0;
      const v = this.#view(row);
      // A fresh learner; the adaptive state is set up when adaptive is switched on.
      new RpmLearner({}, l.rpmStore(row), true).setOverride(null, now);
      this.#rows.set(poolId, row);
      return v.row;
    }
    return NONE;
  }

  #setLimits(v: PoolView, limits: PoolLimits, now: number): void {
    v.set(P_STATE, P_ACTIVE);
    v.set(P_MAX, limits.maxConcurrent);
    v.set(P_QUEUE_LENGTH, limits.queueLength);
    v.set(P_QUEUE_TIMEOUT, limits.queueTimeoutMs);
    v.set(P_RESERVED, limits.reservedConcurrent);
    v.set(P_BUDGET, NONE);
    const min = Math.min(limits.adaptiveMin ?? 1, limits.maxConcurrent);
    if (!limits.adaptive || limits.maxConcurrent === 0) v.set(P_ADAPTIVE, 0);
    else if (v.field(P_ADAPTIVE) === 0) {
      // A pool switched (back) on starts afresh.
      new AdaptiveLimit({ min, max: limits.maxConcurrent }, this.#l.adaptiveStore(v.row), true);
      v.set(P_ADAPTIVE, 1);
    } else v.adaptive.setBounds(min, limits.maxConcurrent);
    v.rpm.setOverride(limits.rpmOverride ?? null, now);
  }

  /** Budgets are rebuilt from scratch; only a capped budget shares anything. */
  #setBudgets(pools: readonly PoolLimits[], budgets: readonly BudgetLimits[]): void {
    const l = this.#l;
    for (let b = 0; b < l.sizes.maxPools; b++) l.budgets[l.budget(b) + B_USED] = 0;
    const caps = new Map<number, number>();
    for (const b of budgets) if (b.originMaxConcurrent !== null) caps.set(b.budgetId, Math.max(0, Math.floor(b.originMaxConcurrent)));
    // Budget id → its row in the budget table, and the share (main thread's view) for the recount.
    const shares = new Map<number, { slot: number; share: BudgetShare<PoolView> }>();
    for (const raw of pools) {
      const row = this.#rows.get(raw.poolId);
      const cap = raw.budgetId === null ? undefined : caps.get(raw.budgetId);
      if (row === undefined || cap === undefined) continue;
      const v = this.#views[row]!;
      if (v.field(P_BUDGET) !== NONE) continue; // a pool listed twice
      let s = shares.get(raw.budgetId!);
      if (s === undefined) {
        const slot = shares.size;
        l.budgets[l.budget(slot) + B_USED] = 1;
        l.budgetIds[slot] = raw.budgetId!;
        shares.set(raw.budgetId!, (s = { slot, share: new BudgetShare<PoolView>(raw.budgetId!, cap, l.shareStore(slot), true) }));
      }
      v.set(P_BUDGET, s.slot);
      s.share.members.push(v);
    }
    for (const { share } of shares.values()) share.recount((m) => m.field(P_QUEUED));
  }

  /** Counts one slot for thread `t` (the one that will hold the permit). */
  #take(v: PoolView, t: number, now: number): void {
    rules.take(v, now);
    this.#l.holdings[t * this.#l.sizes.maxPools + v.row]!++;
  }

  /** Frees one slot thread `t` held and hands it on. */
  #giveBack(v: PoolView, t: number): void {
    if (!rules.give(v)) return;
    this.#l.holdings[t * this.#l.sizes.maxPools + v.row]!--;
    if (v.field(P_STATE) === P_ACTIVE) rules.pump(v, this.#now);
  }

  /** Moves a queued entry to its thread's answered list and marks that thread to be rung. */
  #answer(e: number, result: number, v: PoolView): void {
    const l = this.#l;
    this.#unlink(v, e);
    const eb = l.entry(e);
    const t = l.entries[eb + E_THREAD]!;
    const tb = l.thread(t);
    l.entries[eb + E_STATE] = E_ANSWERED;
    l.entries[eb + E_RESULT] = result;
    l.entries[eb + E_NEXT] = NONE;
    const tail = l.threads[tb + T_TAIL]!;
    if (tail === NONE) l.threads[tb + T_HEAD] = e;
    else l.entries[l.entry(tail) + E_NEXT] = e;
    l.threads[tb + T_TAIL] = e;
    if (this.#ringMark[t] === 0) {
      this.#ringMark[t] = 1;
      this.#ring.push(t);
    }
  }

  #refuseAll(v: PoolView): void {
    for (let e = v.field(P_HEAD); e !== NONE; e = v.field(P_HEAD)) this.#answer(e, R_UNAVAILABLE, v);
  }

  #allocEntry(): number {
    const l = this.#l;
    const e = l.ctl[C_FREE]!;
    if (e !== NONE) l.ctl[C_FREE] = l.entries[l.entry(e) + E_NEXT]!;
    return e;
  }

  #freeEntry(e: number): void {
    const l = this.#l;
    const eb = l.entry(e);
    l.entries[eb + E_STATE] = E_FREE;
    l.entries[eb + E_NEXT] = l.ctl[C_FREE]!;
    l.ctl[C_FREE] = e;
  }

  #enqueue(v: PoolView, e: number): void {
    const l = this.#l;
    const eb = l.entry(e);
    l.entries[eb + E_STATE] = E_QUEUED;
    l.entries[eb + E_THREAD] = this.#thread;
    l.entries[eb + E_POOL] = v.row;
    l.entries[eb + E_NEXT] = NONE;
    const tail = v.field(P_TAIL);
    l.entries[eb + E_PREV] = tail;
    if (tail === NONE) v.set(P_HEAD, e);
    else l.entries[l.entry(tail) + E_NEXT] = e;
    v.set(P_TAIL, e);
    v.set(P_QUEUED, v.field(P_QUEUED) + 1);
    l.entrySeq[e] = ++l.ctlNums[CN_SEQ]!;
    if (v.budget !== null) v.budget.waiting++;
    rules.armGate(v, this.#now());
  }

  /** Takes a queued entry out of its pool's FIFO (O(1), from anywhere in it). */
  #unlink(v: PoolView, e: number): void {
    const l = this.#l;
    const eb = l.entry(e);
    const prev = l.entries[eb + E_PREV]!;
    const next = l.entries[eb + E_NEXT]!;
    if (prev === NONE) v.set(P_HEAD, next);
    else l.entries[l.entry(prev) + E_NEXT] = next;
    if (next === NONE) v.set(P_TAIL, prev);
    else l.entries[l.entry(next) + E_PREV] = prev;
    v.set(P_QUEUED, v.field(P_QUEUED) - 1);
    if (v.budget !== null) v.budget.waiting--;
  }

  // ---- after the lock ----

  /** Rings every thread an answer was pushed for; this thread's own answers are settled right here. */
  #ringThreads(): void {
    if (this.#ring.length === 0) return;
    let self = false;
    const th = this.#l.threads;
    for (const t of this.#ring) {
      this.#ringMark[t] = 0;
      if (t === this.#thread) self = true;
      else {
        const door = this.#l.thread(t) + T_DOORBELL;
        Atomics.add(th, door, 1);
        Atomics.notify(th, door);
      }
    }
    this.#ring.length = 0;
    if (self) this.#drain();
  }

  /** Listens on this thread's doorbell while it has waiters (Atomics.waitAsync does not keep the loop alive). */
  #listen(): void {
    const th = this.#l.threads;
    const door = this.#threadBase + T_DOORBELL;
    for (;;) {
      if (this.#listening || this.#waiters.size === 0) return;
      const seen = Atomics.load(th, door);
      // Answers pushed before `seen` was read would not ring again: settle them first.
      if (Atomics.load(th, this.#threadBase + T_HEAD) !== NONE) {
        this.#drain();
        continue;
      }
      const r = waitAsync(th, door, seen);
      if (!r.async) continue;
      this.#listening = true;
      void r.value.then(this.#onBell);
      return;
    }
  }

  readonly #onBell = (): void => {
    this.#listening = false;
    this.#drain();
    this.#listen();
  };

  /** Settles this thread's answered waiters, oldest first. */
  #drain(): void {
    const l = this.#l;
    const tb = this.#threadBase;
    if (Atomics.load(l.threads, tb + T_HEAD) === NONE) return;
    const answered: number[] = [];
    this.#lock();
    try {
      for (let e = l.threads[tb + T_HEAD]!; e !== NONE; ) {
        const eb = l.entry(e);
        const next = l.entries[eb + E_NEXT]!;
        answered.push(e, l.entries[eb + E_RESULT]!, l.entries[eb + E_POOL]!);
        this.#freeEntry(e);
        e = next;
      }
      l.threads[tb + T_HEAD] = l.threads[tb + T_TAIL] = NONE;
    } finally {
      this.#unlock();
    }
    const now = this.#now();
    for (let i = 0; i < answered.length; i += 3) {
      const e = answered[i]!;
      const granted = answered[i + 1] === R_GRANTED;
      const w = this.#waiters.get(e);
      const v = this.#views[answered[i + 2]!]!;
      if (w === undefined || this.#closed) {
        // Nobody takes this slot (the thread closed): hand it on.
        if (granted) this.#returnSlot(v);
        if (w !== undefined) this.#settle(w, { ok: false, reason: 'unavailable', queuedMs: now - w.enqueuedAt, queued: true });
        continue;
      }
      this.#settle(w, granted ? { ok: true, permit: new SlotPermit(v, now), queuedMs: now - w.enqueuedAt, queued: true } : { ok: false, reason: 'unavailable', queuedMs: now - w.enqueuedAt, queued: true });
    }
  }

  #returnSlot(v: PoolView): void {
    this.#lock();
    try {
      this.#sync();
      this.#giveBack(v, this.#thread);
    } finally {
      this.#unlock();
    }
    this.#ringThreads();
  }

  /** Detaches the timer and the abort listener, then answers the caller. */
  #settle(w: Waiter, a: Admission): void {
    if (this.#waiters.get(w.entry) !== w) return;
    this.#waiters.delete(w.entry);
    if (w.timer !== null) this.#timers.clearTimeout(w.timer);
    w.timer = null;
    w.signal?.removeEventListener('abort', w);
    w.resolve(a);
  }
}
