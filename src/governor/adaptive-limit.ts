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
  #min = 1;
  #max = 1;
  #limit: number;
  readonly #windowSamples: number;
  readonly #shortAlpha: number;
  readonly #longTauMs: number;
  readonly #smoothing: number;
  readonly #minGradient: number;
  readonly #backoffRatio: number;
  readonly #probeIntervalMs: number;
  readonly #probeRatio: number;
  readonly #probeSamples: number;
  #shortRtt = 0;
  #longRtt = 0;
  #lastBackoffAt = -Infinity;
  #windowStart = 0;
  #windowSum = 0;
  #windowCount = 0;
  #windowMaxInFlight = 0;
  /** When the next probe starts; set by the first sample. */
  #nextProbeAt = NaN;
  #probeStartedAt = NaN;
  /** Starts in [from, to) are measured; the probe ends at `#probeEnd`. */
  #probeFrom = 0;
  #probeTo = 0;
  #probeEnd = 0;
  #probeSum = 0;
  #probeCount = 0;

  constructor(opts: AdaptiveLimitOptions) {
    this.setBounds(opts.min, opts.max);
    this.#limit = clamp(opts.initial ?? this.#max, this.#min, this.#max);
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
    const l = this.probing ? this.#limit * this.#probeRatio : this.#limit;
    return Math.max(this.#min, Math.floor(l));
  }

  /** The learned limit, unrounded and not reduced by a probe. */
  get estimate(): number {
    return this.#limit;
  }

  get shortRtt(): number {
    return this.#shortRtt;
  }

  get longRtt(): number {
    return this.#longRtt;
  }

  get probing(): boolean {
    return !Number.isNaN(this.#probeStartedAt);
  }

  /** New floor and ceiling (a live settings change); the current limit is clamped into them. */
  setBounds(min: number, max: number): void {
    this.#max = Math.max(1, Math.floor(max));
    this.#min = Math.min(this.#max, Math.max(1, Math.floor(min)));
    if (this.#limit !== undefined) this.#limit = clamp(this.#limit, this.#min, this.#max);
  }

  /**
   * One released slot: `now` and `rttMs` in ms, `inFlight` the slots held when it was released
   * (itself included). Returns the limit to enforce.
   */
  onSample(now: number, rttMs: number, inFlight: number, kind: SampleKind): number {
    if (kind === SampleKind.Throttled) {
      // Once per round trip: the refusals of one overloaded moment arrive together.
      if (now - this.#lastBackoffAt >= (this.#shortRtt > 0 ? this.#shortRtt : UNKNOWN_RTT_MS)) {
        this.#lastBackoffAt = now;
        this.#limit = Math.max(this.#min, this.#limit * this.#backoffRatio);
      }
      return this.limit;
    }
    if (kind !== SampleKind.Ok || !(rttMs >= 0) || !Number.isFinite(rttMs)) return this.limit;

    if (this.#longRtt === 0) {
      this.#shortRtt = this.#longRtt = rttMs;
      this.#windowStart = now;
      this.#nextProbeAt = now + this.#probeIntervalMs;
      return this.limit;
    }
    if (this.probing) {
      const startedAt = now - rttMs;
      if (startedAt >= this.#probeFrom && startedAt < this.#probeTo) {
        this.#probeSum += rttMs;
        this.#probeCount++;
      }
      if (now >= this.#probeEnd) {
        if (this.#probeCount * 2 >= this.#probeSamples) this.#longRtt = this.#probeSum / this.#probeCount;
        this.#probeStartedAt = NaN;
        this.#nextProbeAt = now + this.#probeIntervalMs;
        this.#resetWindow(now);
      }
      return this.limit;
    }
    if (now >= this.#nextProbeAt) {
      this.#startProbe(now);
      return this.limit;
    }

    this.#windowSum += rttMs;
    this.#windowCount++;
    if (inFlight > this.#windowMaxInFlight) this.#windowMaxInFlight = inFlight;
    if (this.#windowCount < this.#windowSamples || now - this.#windowStart < this.#longRtt) return this.limit;

    const mean = this.#windowSum / this.#windowCount;
    const busiest = this.#windowMaxInFlight;
    const weight = Math.min(1, (now - this.#windowStart) / this.#longTauMs);
    this.#resetWindow(now);
    this.#shortRtt += this.#shortAlpha * (mean - this.#shortRtt);
    this.#longRtt += weight * (this.#shortRtt - this.#longRtt);

    const gradient = clamp(this.#longRtt / this.#shortRtt, this.#minGradient, 1);
    const target = this.#limit * gradient + queueAllowance(this.#limit);
    // An idle pool says nothing about capacity: no growth while less than half the limit was used.
    if (target > this.#limit && busiest < this.#limit / 2) return this.limit;
    this.#limit = clamp(this.#limit + this.#smoothing * (target - this.#limit), this.#min, this.#max);
    return this.limit;
  }

  #startProbe(now: number): void {
    this.#probeStartedAt = now;
    const r = Math.max(this.#shortRtt, this.#longRtt);
    // Long enough for about probeSamples starts at the probe's concurrency, and at least one R.
    const span = r * Math.max(1, this.#probeSamples / Math.max(1, this.limit));
    this.#probeFrom = now + r;
    this.#probeTo = this.#probeFrom + span;
    this.#probeEnd = this.#probeTo + 2 * r;
    this.#probeSum = 0;
    this.#probeCount = 0;
  }

  #resetWindow(now: number): void {
    this.#windowStart = now;
    this.#windowSum = 0;
    this.#windowCount = 0;
    this.#windowMaxInFlight = 0;
  }
}

/** The backoff interval before any latency was measured. */
const UNKNOWN_RTT_MS = 100;

/** The queue the limit allows beyond the measured capacity: half its square root, at least one slot. */
function queueAllowance(limit: number): number {
  return Math.max(1, Math.sqrt(limit) / 2);
}

function clamp(v: number, lo: number, hi: number): number {
  return v < lo ? lo : v > hi ? hi : v;
}
