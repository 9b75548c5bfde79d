// Where every count of the shared-memory governor lives: one SharedArrayBuffer cut into typed views
// (control words, threads, pools, budgets, waiter entries, per-thread holdings), the same in every thread.
import { ADAPTIVE_STATE_SIZE } from './adaptive-limit.js';
import { BUDGET_FIELDS } from './budget-share.js';
import { RPM_STATE_SIZE } from './rpm-learner.js';

/** The fixed capacities of one shared governor (its buffer cannot grow: every thread maps the same one). */
export interface SharedSizes {
  /** Pools known at once, draining ones included. */
  maxPools: number;
  /** Waiters queued at once across all pools and threads. */
  maxWaiters: number;
  /** Threads that may attach (the main thread included). */
  maxThreads: number;
}

export const DEFAULT_SIZES: SharedSizes = { maxPools: 4096, maxWaiters: 65_536, maxThreads: 64 };

// Control words (Int32).
export const C_LOCK = 0;
/** Bumped by every configure(): a thread whose pool map is older rebuilds it. */
export const C_VERSION = 1;
/** Head of the free list of waiter entries (-1: none left). */
export const C_FREE = 2;
/** 1 once the main thread closed the governor. */
export const C_CLOSED = 3;
/** The thread holding the lock, plus one (0: none), so reclaim() can free a lock a terminated worker held. */
export const C_OWNER = 4;
const C_FIELDS = 5;
// Control numbers (Float64).
/** The arrival counter: the order of waiters across pools and threads. */
export const CN_SEQ = 0;
const CN_FIELDS = 1;

// Per thread (Int32).
/** T_FREE, T_HANDED (a handle was made for it) or T_ATTACHED. */
export const T_STATE = 0;
/** Bumped (and notified) whenever an answer for this thread's waiters is pushed. */
export const T_DOORBELL = 1;
/** The answered list: entries a release or a configure settled for this thread, oldest first. */
export const T_HEAD = 2;
export const T_TAIL = 3;
/** Bumped when the main thread reclaims the slot: permits of the old occupant then release nothing. */
export const T_GEN = 4;
const T_FIELDS = 5;
export const T_FREE = 0;
export const T_HANDED = 1;
export const T_ATTACHED = 2;

// Per pool (Int32).
/** P_UNUSED, P_ACTIVE, or P_DRAINING (left the configuration, permits still out). */
export const P_STATE = 0;
export const P_MAX = 1;
export const P_QUEUE_LENGTH = 2;
export const P_QUEUE_TIMEOUT = 3;
export const P_RESERVED = 4;
/** Index of the pool's capped budget in the budget table, or -1. */
export const P_BUDGET = 5;
export const P_IN_FLIGHT = 6;
/** The pool's FIFO of waiter entries: head, tail, size. */
export const P_HEAD = 7;
export const P_TAIL = 8;
export const P_QUEUED = 9;
/** 1 while the adaptive limit is on. */
export const P_ADAPTIVE = 10;
const P_FIELDS = 11;
export const P_UNUSED = 0;
export const P_ACTIVE = 1;
export const P_DRAINING = 2;
// Per pool (Float64): id, average hold time, then the adaptive limit's and the RPM learner's state.
export const PN_ID = 0;
export const PN_AVG_HOLD = 1;
export const PN_ADAPTIVE = 2;
export const PN_RPM = PN_ADAPTIVE + ADAPTIVE_STATE_SIZE;
const PN_FIELDS = PN_RPM + RPM_STATE_SIZE;

// Per budget (Int32): in use, then the BudgetShare counts. Float64: the budget id.
export const B_USED = 0;
export const B_SHARE = 1;
const B_FIELDS = B_SHARE + BUDGET_FIELDS;

// Per waiter entry (Int32). Float64: its arrival number.
/** E_FREE, E_QUEUED (in its pool's FIFO) or E_ANSWERED (in its thread's answered list). */
export const E_STATE = 0;
export const E_THREAD = 1;
export const E_POOL = 2;
export const E_PREV = 3;
export const E_NEXT = 4;
/** With E_ANSWERED: R_GRANTED (the slot is counted for the waiter) or R_UNAVAILABLE. */
export const E_RESULT = 5;
const E_FIELDS = 6;
export const E_FREE = 0;
export const E_QUEUED = 1;
export const E_ANSWERED = 2;
export const R_GRANTED = 1;
export const R_UNAVAILABLE = 2;

export const NONE = -1;

/** What a worker needs to map the same memory: structured-cloneable (postMessage, workerData). */
export interface SharedGovernorHandle {
  readonly buffer: SharedArrayBuffer;
  readonly sizes: SharedSizes;
  /** The thread slot reserved for the worker this handle is for. */
  readonly thread: number;
}

/** The typed views over one buffer; `base*` give the first slot of a row. */
export class SharedLayout {
  readonly sizes: SharedSizes;
  readonly buffer: SharedArrayBuffer;
  readonly ctl: Int32Array;
  readonly ctlNums: Float64Array;
  readonly threads: Int32Array;
  readonly pools: Int32Array;
  readonly poolNums: Float64Array;
  readonly budgets: Int32Array;
  readonly budgetIds: Float64Array;
  readonly entries: Int32Array;
  readonly entrySeq: Float64Array;
  /** Slots each thread holds per pool (thread · maxPools + pool), so a dead thread's slots can be given back. */
  readonly holdings: Int32Array;

  /** Maps `buffer`, or allocates and initialises a new one when absent. */
  constructor(sizes: SharedSizes, buffer?: SharedArrayBuffer) {
    this.sizes = sizes;
    const { maxPools, maxWaiters, maxThreads } = sizes;
    // Float64 regions first, so every region is aligned to its element size.
    const f64 = [CN_FIELDS, maxPools * PN_FIELDS, maxPools, maxWaiters];
    const i32 = [C_FIELDS, maxThreads * T_FIELDS, maxPools * P_FIELDS, maxPools * B_FIELDS, maxWaiters * E_FIELDS, maxThreads * maxPools];
    const bytes = f64.reduce((s, n) => s + n * 8, 0) + i32.reduce((s, n) => s + n * 4, 0);
    const fresh = buffer === undefined;
    this.buffer = buffer ?? new SharedArrayBuffer(bytes);
    if (this.buffer.byteLength !== bytes) throw new Error('shared governor buffer does not match its sizes');
    let at = 0;
    const f = (n: number): Float64Array => {
      const v = new Float64Array(this.buffer, at, n);
      at += n * 8;
      return v;
    };
    const i = (n: number): Int32Array => {
      const v = new Int32Array(this.buffer, at, n);
      at += n * 4;
      return v;
    };
    this.ctlNums = f(f64[0]!);
    this.poolNums = f(f64[1]!);
    this.budgetIds = f(f64[2]!);
    this.entrySeq = f(f64[3]!);
    this.ctl = i(i32[0]!);
    this.threads = i(i32[1]!);
    this.pools = i(i32[2]!);
    this.budgets = i(i32[3]!);
    this.entries = i(i32[4]!);
    this.holdings = i(i32[5]!);
    if (fresh) this.#init();
  }

  #init(): void {
    // Every waiter entry starts on the free list.
    for (let e = 0; e < this.sizes.maxWaiters; e++) this.entries[e * E_FIELDS + E_NEXT] = e + 1 < this.sizes.maxWaiters ? e + 1 : NONE;
    this.ctl[C_FREE] = this.sizes.maxWaiters > 0 ? 0 : NONE;
    for (let t = 0; t < this.sizes.maxThreads; t++) {
      this.threads[t * T_FIELDS + T_HEAD] = NONE;
      this.threads[t * T_FIELDS + T_TAIL] = NONE;
    }
  }

  thread(t: number): number {
    return t * T_FIELDS;
  }

  pool(p: number): number {
    return p * P_FIELDS;
  }

  poolNum(p: number): number {
    return p * PN_FIELDS;
  }

  budget(b: number): number {
    return b * B_FIELDS;
  }

  entry(e: number): number {
    return e * E_FIELDS;
  }

  /** The pool's adaptive-limit state, as a view for AdaptiveLimit. */
  adaptiveStore(p: number): Float64Array {
    return this.poolNums.subarray(p * PN_FIELDS + PN_ADAPTIVE, p * PN_FIELDS + PN_ADAPTIVE + ADAPTIVE_STATE_SIZE);
  }

  /** The pool's RPM learner state, as a view for RpmLearner. */
  rpmStore(p: number): Float64Array {
    return this.poolNums.subarray(p * PN_FIELDS + PN_RPM, p * PN_FIELDS + PN_RPM + RPM_STATE_SIZE);
  }

  /** The budget's counts, as a view for BudgetShare. */
  shareStore(b: number): Int32Array {
    return this.budgets.subarray(b * B_FIELDS + B_SHARE, b * B_FIELDS + B_SHARE + BUDGET_FIELDS);
  }
}
