// The governor interface: admission to a pool's concurrency slots. One interface, three implementations
// (memory: one thread; shared-memory: the threads of one process; redis: many nodes). A refusal is a
// value, never an exception; a permit is settled exactly once.

import type { LearnedState } from './outcome-learning.js';

/** What the upstream said, fed to the adaptive limit and the RPM learner on release. */
export interface Outcome {
  /** Final upstream HTTP status (100–599); absent when there was no answer. */
  status?: number;
  /** Time the slot was held for the upstream call, in ms. */
  latencyMs?: number;
  /** Upstream 429 responses observed. */
  throttled?: number;
  /** Upstream retry hint in ms. */
  retryAfterMs?: number;
  /** The work was dropped (client abort, upstream reset or timeout): not a latency sample. */
  dropped?: boolean;
  /** Raw upstream response headers (rate-limit headers) for the RPM learner. */
  headers?: Record<string, string | string[] | undefined>;
  /** Pre-parsed rate fields from a lock release; when present the RPM learner reads these, not `headers`. */
  rate?: RateFields;
}

/** Rate-limit figures a lock client already parsed (spec: release `rate`); further numeric members pass through. */
export interface RateFields {
  limit?: number;
  remaining?: number;
  resetMs?: number;
  tokenLimit?: number;
  [member: string]: number | undefined;
}

export interface Permit {
  readonly poolId: number;
  /** Frees the slot. Idempotent: only the first call counts. */
  release(outcome?: Outcome): void;
}

/** `rate_limited`: the pool's RPM gate is shut (learned or fixed rate spent, or the upstream asked to wait). */
export type RefusalReason = 'queue_full' | 'no_slot' | 'queue_timeout' | 'aborted' | 'unavailable' | 'rate_limited';

/**
 * `queued` says whether the caller really entered the governor's wait queue: a promise alone does not mean
 * it waited (the Redis governor answers every acquire with one, after a round trip).
 */
export type Admission =
  | { ok: true; permit: Permit; queuedMs: number; queued: boolean }
  | {
      ok: false;
      reason: RefusalReason;
      queuedMs: number;
      retryAfterMs?: number;
      /** With `unavailable`: the shared governor's backend (Redis) cannot be reached, not a missing pool. */
      backendDown?: boolean;
      /** True when refused after waiting in the queue (timeout, abort, pool removed); absent otherwise. */
      queued?: boolean;
    };

export interface AdmitRequest {
  poolId: number;
  /** How long to wait in the queue; 0 fails fast. Already clamped to the pool's queue timeout. */
  waitMs: number;
  /**
   * The one kind of abort signal: aborting leaves the queue (reason `aborted`) or, once admitted, changes
   * nothing (release the permit). Its AbortSignal is asked for only when the request has to wait: most
   * requests get a slot at once, and an AbortController per request is a measurable share of the HTTP data
   * plane's time. A client side is one; a caller that holds an AbortSignal passes abortableOf(signal).
   */
  abortable?: LazyAbortSignal;
}

export interface LazyAbortSignal {
  readonly aborted: boolean;
  signal(): AbortSignal;
}

/** An AbortSignal the caller already holds, as the one kind AdmitRequest takes. */
export function abortableOf(signal: AbortSignal): LazyAbortSignal {
  return {
    get aborted() {
      return signal.aborted;
    },
    signal: () => signal,
  };
}

/** Whether the request was aborted before it asked. */
export function abortedAlready(req: AdmitRequest): boolean {
  return req.abortable?.aborted ?? false;
}

/** The signal a waiting request listens on (a lazy one is made now). */
export function waitSignal(req: AdmitRequest): AbortSignal | undefined {
  return req.abortable?.signal();
}

export interface PoolLimits {
  poolId: number;
  maxConcurrent: number;
  queueLength: number;
  queueTimeoutMs: number;
  budgetId: number | null;
  reservedConcurrent: number;
  /** Adaptive concurrency on or off (absent: off; the pool setting defaults to on) and its floor (default 1). */
  adaptive?: boolean;
  adaptiveMin?: number;
  /** A fixed requests-per-minute gate; null or absent lets the RPM learner decide. */
  rpmOverride?: number | null;
}

export interface BudgetLimits {
  budgetId: number;
  /** Across every pool of the budget; null means the budget does not cap the sum. */
  originMaxConcurrent: number | null;
}

export interface PoolState {
  inFlight: number;
  queued: number;
  effectiveLimit: number;
  remaining: number;
}

export interface Governor {
  /** What a pool's adaptive limit and RPM learner know in this process (the operator's "why is the limit 2?"). */
  learned?(poolId: number): LearnedState | null;
  /** Replaces the limits of every pool (called on each config snapshot). In-flight permits stay valid. */
  configure(pools: readonly PoolLimits[], budgets: readonly BudgetLimits[]): void;
  /** Synchronous when a slot is free (the hot path allocates no promise); a promise when it must wait. */
  acquire(req: AdmitRequest): Admission | Promise<Admission>;
  state(poolId: number): PoolState;
  close(): Promise<void>;
}
