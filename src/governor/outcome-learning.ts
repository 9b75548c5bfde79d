// What one released slot teaches a pool: the upstream's answer fed to its RPM learner and adaptive limit,
// the retry hint from hold times, and what a pool has learned (shared by the memory, shared-memory and Redis
// governors).
import type { Outcome } from './governor.js';
import { type AdaptiveLimit, SampleKind } from './adaptive-limit.js';
import { applyRateObject, clearRateInfo, emptyRateInfo, hasRateInfo, parseRateHeaders, type RateInfo } from './rate-headers.js';
import type { RpmLearner } from './rpm-learner.js';

/** Weight of the newest hold time in the moving average behind the retry hint. */
const HOLD_WEIGHT = 0.1;
/** The retry hint is whole seconds (Retry-After has second granularity), within these bounds. */
const RETRY_MIN_MS = 1_000;
const RETRY_MAX_MS = 60_000;
/** Hold time assumed before a pool has released anything. */
const DEFAULT_HOLD_MS = 1_000;

/** Scratch for parsing one outcome: a thread runs one release at a time, so one object serves all. */
const RATE: RateInfo = emptyRateInfo();
/** Why the last readOutcome's answer was a throttle signal (scratch too; read by applyOutcome). */
let throttleCause: AdjustmentCause = 'status_429';

/**
 * Why an adaptive limit moved (issue 26 item 4: "why is the effective limit 2 when max is 10?"):
 * latency_gradient: the recent latency rose above the long-term one, so the limit came down in proportion;
 * growth: latency held, the pool was busy, the limit rose; status_429 / throttled / rate_headers: the upstream
 * refused for load (a 429, a lock client's throttled count, a Retry-After or rate headers' hint), so it backed off;
 * probe / probe_end: the periodic probe lowered the limit for a moment to measure latency without load.
 */
export type AdjustmentCause = 'latency_gradient' | 'growth' | 'status_429' | 'throttled' | 'rate_headers' | 'probe' | 'probe_end';

export interface Adjustment {
  /** Wall-clock ms. */
  at: number;
  from: number;
  to: number;
  cause: AdjustmentCause;
  shortRttMs: number;
  longRttMs: number;
}

/** How many adjustments each pool keeps (per process: each data plane process learns on its own releases). */
export const ADJUSTMENTS_KEPT = 20;
const adjustments = new WeakMap<AdaptiveLimit, Adjustment[]>();

/** The pool's last adjustments, oldest first. */
export function adjustmentsOf(adaptive: AdaptiveLimit | null): readonly Adjustment[] {
  return (adaptive && adjustments.get(adaptive)) ?? [];
}

/**
 * Reads one upstream answer without touching any learner, so a caller holding a lock can parse first. A lock
 * release's `rate` object wins over headers field by field. A retry hint counts only on a refusal (429 or
 * 503, a throttled count, or no status, as a lock client reports it). A 429 the rate headers explain (the
 * window's `remaining` is 0) is a rate signal, not a concurrency one; answers without a status, and 5xx
 * answers, are not latency samples (an error's speed says nothing about the service time). The rate fields
 * stay in this module's scratch for the applyOutcome that follows (no allocation per release).
 */
export function readOutcome(o: Outcome, wallClock: number): SampleKind {
  const info = o.headers !== undefined ? parseRateHeaders(o.headers, wallClock, RATE) : clearRateInfo(RATE);
  if (o.rate !== undefined && o.rate !== null && typeof o.rate === 'object') applyRateObject(o.rate, info);
  const status = o.status;
  const throttled = status === 429 || (o.throttled !== undefined && o.throttled > 0);
  const hint = o.retryAfterMs !== undefined && o.retryAfterMs >= 0 ? o.retryAfterMs : info.retryAfterMs;
  const refusal = throttled || status === undefined || status === 503;
  info.retryAfterMs = refusal && hint >= 0 ? hint : NaN;
  let kind: SampleKind = SampleKind.Ok;
  if ((throttled || info.retryAfterMs >= 0) && info.remaining !== 0) {
    kind = SampleKind.Throttled;
    throttleCause = status === 429 ? 'status_429' : throttled ? 'throttled' : 'rate_headers';
  }
  else if (o.dropped === true || status === undefined || status >= 500 || throttled) kind = SampleKind.Dropped;
  return kind;
}

/**
 * Feeds the last readOutcome to the RPM learner and the adaptive limit (null while adaptive is off), with
 * nothing read in between. `inFlight` counts the released slot itself.
 */
export function applyOutcome(kind: SampleKind, latencyMs: number, now: number, rpm: RpmLearner, adaptive: AdaptiveLimit | null, inFlight: number): void {
  if (hasRateInfo(RATE)) rpm.observe(now, RATE);
  if (adaptive === null) return;
  const before = adaptive.limit;
  const wasProbing = adaptive.probing;
  adaptive.onSample(now, latencyMs, inFlight, kind);
  const after = adaptive.limit;
  if (after === before) return;
  // Rare (a whole slot's change), so the record may allocate.
  const cause: AdjustmentCause = kind === SampleKind.Throttled ? throttleCause
    : adaptive.probing !== wasProbing ? (wasProbing ? 'probe_end' : 'probe')
    : after < before ? 'latency_gradient' : 'growth';
  let list = adjustments.get(adaptive);
  if (!list) adjustments.set(adaptive, (list = []));
  list.push({ at: Date.now(), from: before, to: after, cause, shortRttMs: adaptive.shortRtt, longRttMs: adaptive.longRtt });
  if (list.length > ADJUSTMENTS_KEPT) list.shift();
}

/** readOutcome then applyOutcome, for callers with no lock to keep short. */
export function learnOutcome(o: Outcome, held: number, now: number, wallClock: number, rpm: RpmLearner, adaptive: AdaptiveLimit | null, inFlight: number): void {
  applyOutcome(readOutcome(o, wallClock), o.latencyMs ?? held, now, rpm, adaptive, inFlight);
}

/** The moving average of hold times after one more release. */
export function nextAvgHold(avg: number, held: number): number {
  return avg === 0 ? held : avg + HOLD_WEIGHT * (held - avg);
}

/**
 * Seconds-granular hint for when a slot may free: the average hold time times the waiters ahead (plus
 * this caller), spread over the pool's slots.
 */
export function retryHintMs(avgHoldMs: number, queued: number, limit: number): number {
  const hold = avgHoldMs > 0 ? avgHoldMs : DEFAULT_HOLD_MS;
  const ms = (hold * (queued + 1)) / Math.max(1, limit);
  return Math.min(RETRY_MAX_MS, Math.max(RETRY_MIN_MS, Math.ceil(ms / 1000) * 1000));
}

/** Refusal hint while the RPM gate is shut: when it reopens, in whole seconds. */
export function gateRetryHintMs(wait: number): number {
  return Math.max(RETRY_MIN_MS, Math.ceil(wait / 1000) * 1000);
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
  /** The limit enforced now (lowered while a probe runs); null when adaptive is off. */
  effectiveLimit: number | null;
  probing: boolean;
  /** The adaptive limit's last whole-slot moves in this process, oldest first, with their cause. */
  adjustments: readonly Adjustment[];
}

const orNull = (n: number): number | null => (Number.isNaN(n) ? null : n);

/** One pool's learners read out (`adaptive` null while adaptive is off). */
export function learnedState(adaptive: AdaptiveLimit | null, rpm: RpmLearner, gateWaitMs: number): LearnedState {
  return {
    adaptiveLimit: adaptive === null ? null : Math.floor(adaptive.estimate),
    shortRttMs: adaptive?.shortRtt ?? 0,
    longRttMs: adaptive?.longRtt ?? 0,
    learnedRpm: orNull(rpm.learnedRpm),
    gateRpm: orNull(rpm.gateRpm),
    tokenLimit: orNull(rpm.tokenLimit),
    gateWaitMs,
    effectiveLimit: adaptive === null ? null : adaptive.limit,
    probing: adaptive?.probing ?? false,
    adjustments: [...adjustmentsOf(adaptive)],
  };
}
