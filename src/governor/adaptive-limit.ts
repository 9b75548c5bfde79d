// The adaptive concurrency limit: a pure gradient controller fed one sample per released slot.

/**
 * What one released slot tells the controller: `Ok` the upstream answered (a latency sample);
 * `Dropped` no answer or one nobody waited for (abort, reset, timeout), not a latency sample;
 * `Throttled` the upstream refused for load (429, a throttled count, a retry hint): back off.
 */
export const SampleKind = { Ok: 0, Dropped: 1, Throttled: 2 } as const;
export type SampleKind = (typeof SampleKind)[keyof typeof SampleKind];

export interface AdaptiveLimitOptions {
  /** Floor and ceiling of the limit (adaptiveMin and max_concurrent). */
  min: number;
  max: number;
  /** Starting limit; the ceiling when absent (the operator's figure until latency says otherwise). */
  initial?: number;
  /** Samples a window needs before it closes (it also lasts at least one long-term RTT). */
  windowSamples?: number;
  /** Windows in the short-term RTT average (EWMA span). */
  shortWindows?: number;
  /** Time constant of the long-term RTT average, ms (an EWMA weighted by each window's duration). */
  longTauMs?: number;
  /** Weight of each window's new limit against the old one. */
  smoothing?: number;
  /** Lowest gradient of one step: one window never more than halves the limit. */
  minGradient?: number;
  /** Multiplier applied on a throttled sample, at most once per short-term RTT. */
  backoffRatio?: number;
  /** The long-term RTT is re-measured at reduced concurrency this often (ms). */
  probeIntervalMs?: number;
  /** Concurrency during a probe, as a fraction of the limit. */
  probeRatio?: number;
  /** Samples a probe aims to measure (at least half of them, or the probe changes nothing). */
  probeSamples?: number;
}

/**
 * A gradient controller in the spirit of Netflix's Gradient2 and Envoy's adaptive concurrency filter.
 *
 * Samples are gathered in windows of at least `windowSamples` answers and one long-term RTT; each
 * closed window feeds its mean latency to two exponential averages, a short-term one over a couple of
 * windows (what the upstream does now) and a long-term one over minutes (what it does unloaded), and
 * moves the limit towards
 * `limit · clamp(long / short, minGradient, 1) + queueAllowance(limit)` by `smoothing`. While the
 * upstream keeps up, short ≈ long, the gradient is 1 and the allowance grows the limit; once in-flight
 * passes the upstream's capacity C the latency rises in proportion and the limit settles where
 * `limit · long / short + allowance = limit`, i.e. C plus the allowance (log10(limit), at least one:
 * a queue of a few slots). One step per window, about one round trip, rather than per sample: the
 * latency of a limit is only seen a round trip later, and stepping on every sample of that stale
 * picture overshoots and oscillates.
 *
 * Held at its limit the upstream answers slower than unloaded, so a long-term average fed from those
 * windows drifts up and carries the limit with it (Gradient2's known weakness). Every
 * `probeIntervalMs` the controller therefore probes like Envoy's minRTT window: it offers
 * `probeRatio · limit` for a few round trips R (the short-term RTT when the probe starts). The
 * requests that started in the first R still met the old load and are skipped; those that started in
 * the next span (long enough for about `probeSamples` of them) are measured, and the probe ends two R
 * later so that slow ones are counted too (ending at the N-th answer would keep only the fastest).
 * Their mean latency becomes the long-term RTT, up or down: an upstream that really got slower is
 * learned here.
 *
 * A throttled sample multiplies the limit by `backoffRatio`, at most once per short-term RTT (100 ms
 * before one is known): all the requests in flight when the upstream started refusing report it, and
 * one backoff per round trip is the TCP rule. A dropped sample changes nothing. The limit does not
 * grow from a window in which fewer than half of it were in flight: an idle pool says nothing about
 * the upstream's capacity.
 *
 * Pure and O(1): time comes in with each sample (no clock is read) and nothing is allocated, so a
 * distributed governor can run the same controller on each node and share the result.
 */
export class AdaptiveLimit {
  readonly #windowSamples: number;
  readonly #shortAlpha: number;
  readonly #longTauMs: number;
  readonly #smoothing: number;
  readonly #minGradient: number;
  readonly #backoffRatio: number;
  readonly #probeIntervalMs: number;
  readonly #probeRatio: number;
  readonly #probeSamples: number;
  /** The learned state, indexed by the slot names below (direct indexing: accessors would cost 10×). */
  readonly #s: Float64Array;

  /**
   * `store` (ADAPTIVE_STATE_SIZE long) holds the learned state, so a view into shared memory lets every
   * thread feed one controller; `init` false attaches to a state another thread set up (same options).
   */
  constructor(opts: AdaptiveLimitOptions, store: Float64Array = new Float64Array(ADAPTIVE_STATE_SIZE), init = true) {
    this.#s = store;
    if (init) {
      store.set(INITIAL_STATE);
      this.setBounds(opts.min, opts.max);
      this.#s[LIMIT] = clamp(opts.initial ?? this.#s[MAX], this.#s[MIN], this.#s[MAX]);
    }
    this.#windowSamples = opts.windowSamples ?? 10;
    this.#shortAlpha = 2 / ((opts.shortWindows ?? 2) + 1);
    this.#longTauMs = opts.longTauMs ?? 600_000;
    this.#smoothing = opts.smoothing ?? 0.2;
    this.#minGradient = opts.minGradient ?? 0.5;
    this.#backoffRatio = opts.backoffRatio ?? 0.9;
    this.#probeIntervalMs = opts.probeIntervalMs ?? 30_000;
    this.#probeRatio = opts.probeRatio ?? 0.5;
    this.#probeSamples = opts.probeSamples ?? 10;
  }

  /** The limit to enforce now (an integer within the bounds; reduced while probing). */
  get limit(): number {
    const l = this.probing ? this.#s[LIMIT] * this.#probeRatio : this.#s[LIMIT];
    return Math.max(this.#s[MIN], Math.floor(l));
  }

  /** The learned limit, unrounded and not reduced by a probe. */
  get estimate(): number {
    return this.#s[LIMIT];
  }

  get shortRtt(): number {
    return this.#s[SHORT_RTT];
  }

  get longRtt(): number {
    return this.#s[LONG_RTT];
  }

  get probing(): boolean {
    return !Number.isNaN(this.#s[PROBE_STARTED_AT]);
  }

  /** New floor and ceiling (a live settings change); the current limit is clamped into them. */
  setBounds(min: number, max: number): void {
    this.#s[MAX] = Math.max(1, Math.floor(max));
    this.#s[MIN] = Math.min(this.#s[MAX], Math.max(1, Math.floor(min)));
    this.#s[LIMIT] = clamp(this.#s[LIMIT], this.#s[MIN], this.#s[MAX]);
  }

  /**
   * One released slot: `now` and `rttMs` in ms, `inFlight` the slots held when it was released
   * (itself included). Returns the limit to enforce.
   */
  onSample(now: number, rttMs: number, inFlight: number, kind: SampleKind): number {
    if (kind === SampleKind.Throttled) {
      // Once per round trip: the refusals of one overloaded moment arrive together.
      if (now - this.#s[LAST_BACKOFF_AT] >= (this.#s[SHORT_RTT] > 0 ? this.#s[SHORT_RTT] : UNKNOWN_RTT_MS)) {
        this.#s[LAST_BACKOFF_AT] = now;
        this.#s[LIMIT] = Math.max(this.#s[MIN], this.#s[LIMIT] * this.#backoffRatio);
      }
      return this.limit;
    }
    if (kind !== SampleKind.Ok || !(rttMs >= 0) || !Number.isFinite(rttMs)) return this.limit;

    if (this.#s[LONG_RTT] === 0) {
      this.#s[SHORT_RTT] = this.#s[LONG_RTT] = rttMs;
      this.#s[WINDOW_START] = now;
      this.#s[NEXT_PROBE_AT] = now + this.#probeIntervalMs;
      return this.limit;
    }
    if (this.probing) {
      const startedAt = now - rttMs;
      if (startedAt >= this.#s[PROBE_FROM] && startedAt < this.#s[PROBE_TO]) {
        this.#s[PROBE_SUM] += rttMs;
        this.#s[PROBE_COUNT]++;
      }
      if (now >= this.#s[PROBE_END]) {
        if (this.#s[PROBE_COUNT] * 2 >= this.#probeSamples) this.#s[LONG_RTT] = this.#s[PROBE_SUM] / this.#s[PROBE_COUNT];
        this.#s[PROBE_STARTED_AT] = NaN;
        this.#s[NEXT_PROBE_AT] = now + this.#probeIntervalMs;
        this.#resetWindow(now);
      }
      return this.limit;
    }
    if (now >= this.#s[NEXT_PROBE_AT]) {
      this.#startProbe(now);
      return this.limit;
    }

    this.#s[WINDOW_SUM] += rttMs;
    this.#s[WINDOW_COUNT]++;
    if (inFlight > this.#s[WINDOW_MAX_IN_FLIGHT]) this.#s[WINDOW_MAX_IN_FLIGHT] = inFlight;
    if (this.#s[WINDOW_COUNT] < this.#windowSamples || now - this.#s[WINDOW_START] < this.#s[LONG_RTT]) return this.limit;

    const mean = this.#s[WINDOW_SUM] / this.#s[WINDOW_COUNT];
    const busiest = this.#s[WINDOW_MAX_IN_FLIGHT];
    const weight = Math.min(1, (now - this.#s[WINDOW_START]) / this.#longTauMs);
    this.#resetWindow(now);
    this.#s[SHORT_RTT] += this.#shortAlpha * (mean - this.#s[SHORT_RTT]);
    this.#s[LONG_RTT] += weight * (this.#s[SHORT_RTT] - this.#s[LONG_RTT]);

    const gradient = clamp(this.#s[LONG_RTT] / this.#s[SHORT_RTT], this.#minGradient, 1);
    const target = this.#s[LIMIT] * gradient + queueAllowance(this.#s[LIMIT]);
    // An idle pool says nothing about capacity: no growth while less than half the limit was used.
    if (target > this.#s[LIMIT] && busiest < this.#s[LIMIT] / 2) return this.limit;
    this.#s[LIMIT] = clamp(this.#s[LIMIT] + this.#smoothing * (target - this.#s[LIMIT]), this.#s[MIN], this.#s[MAX]);
    return this.limit;
  }

  #startProbe(now: number): void {
    this.#s[PROBE_STARTED_AT] = now;
    const r = Math.max(this.#s[SHORT_RTT], this.#s[LONG_RTT]);
    // Long enough for about probeSamples starts at the probe's concurrency, and at least one R.
    const span = r * Math.max(1, this.#probeSamples / Math.max(1, this.limit));
    this.#s[PROBE_FROM] = now + r;
    this.#s[PROBE_TO] = this.#s[PROBE_FROM] + span;
    this.#s[PROBE_END] = this.#s[PROBE_TO] + 2 * r;
    this.#s[PROBE_SUM] = 0;
    this.#s[PROBE_COUNT] = 0;
  }

  #resetWindow(now: number): void {
    this.#s[WINDOW_START] = now;
    this.#s[WINDOW_SUM] = 0;
    this.#s[WINDOW_COUNT] = 0;
    this.#s[WINDOW_MAX_IN_FLIGHT] = 0;
  }
}

/** Slots of the learned state: min, max, limit, RTTs, the open window and the probe (named below). */
export const ADAPTIVE_STATE_SIZE = 17;
const MIN = 0;
const MAX = 1;
const LIMIT = 2;
const SHORT_RTT = 3;
const LONG_RTT = 4;
const LAST_BACKOFF_AT = 5;
const WINDOW_START = 6;
const WINDOW_SUM = 7;
const WINDOW_COUNT = 8;
const WINDOW_MAX_IN_FLIGHT = 9;
const NEXT_PROBE_AT = 10;
const PROBE_STARTED_AT = 11;
const PROBE_FROM = 12;
const PROBE_TO = 13;
const PROBE_END = 14;
const PROBE_SUM = 15;
const PROBE_COUNT = 16;
/** A fresh controller's state: no RTT known, never backed off, no probe scheduled. */
const INITIAL_STATE = [1, 1, 0, 0, 0, -Infinity, 0, 0, 0, 0, NaN, NaN, 0, 0, 0, 0, 0];

/** The backoff interval before any latency was measured. */
const UNKNOWN_RTT_MS = 100;

/** The queue the limit allows beyond the measured capacity: half its square root, at least one slot. */
function queueAllowance(limit: number): number {
  return Math.max(1, Math.sqrt(limit) / 2);
}

function clamp(v: number, lo: number, hi: number): number {
  return v < lo ? lo : v > hi ? hi : v;
}
