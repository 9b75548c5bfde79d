// Adaptive in-flight limit of one webhook destination (AIMD with a latency signal, after Netflix's
// concurrency-limits): the deliverer sends at most `limit` deliveries to a destination at once.
//   - Slow start: until the first back-off, each fast success adds 1 (the limit doubles per round trip).
//   - Then additive increase: a fast success while the limit is in use adds 1/limit (+1 per round trip).
//   - A failure (error, timeout, non-2xx) halves it; an answer much slower than the destination's
//     baseline (4×, and 250 ms more at least) takes 10% off. At most one decrease per window, so a burst of simultaneous failures
//     counts once; never below `min`, never above `max` (the configured ceiling).
// The baseline is the fastest answer of the last 10 s window (so it can rise when a receiver moves).

export interface LimitOptions {
  initial: number;
  min: number;
  /** The ceiling (config webhookDestinationConcurrency). */
  max: number;
}

/**
 * An answer slower than this many times the baseline, and this much slower at least, counts as congestion
 * (a margin wide enough that scheduling noise on a busy machine is not taken for a struggling receiver).
 */
const SLOW_FACTOR = 4;
const SLOW_MARGIN_MS = 250;
const BASELINE_WINDOW_MS = 10_000;
/** Shortest time between two decreases. */
const DECREASE_WINDOW_MS = 100;

export class DestinationLimit {
  #limit: number;
  inFlight = 0;
  readonly #o: LimitOptions;
  #slowStart = true;
  #baseline = Infinity;
  #windowMin = Infinity;
  #windowStart = 0;
  #lastDecrease = -Infinity;

  constructor(o: LimitOptions) {
    this.#o = o;
    this.#limit = Math.min(o.max, Math.max(o.min, o.initial));
  }

  /** Whole deliveries that may be sent now. */
  get limit(): number {
    return Math.floor(this.#limit);
  }

  get room(): number {
    return Math.max(0, this.limit - this.inFlight);
  }

  /** Records one finished send (called after inFlight is decremented by the caller). */
  onOutcome(ok: boolean, latencyMs: number, now: number): void {
    if (now - this.#windowStart > BASELINE_WINDOW_MS) {
      if (this.#windowMin !== Infinity) this.#baseline = this.#windowMin;
      this.#windowMin = Infinity;
      this.#windowStart = now;
    }
    if (ok) {
      this.#windowMin = Math.min(this.#windowMin, latencyMs);
      if (this.#baseline === Infinity) this.#baseline = latencyMs;
      else this.#baseline = Math.min(this.#baseline, latencyMs);
    }
    const slow = ok && latencyMs > Math.max(this.#baseline * SLOW_FACTOR, this.#baseline + SLOW_MARGIN_MS);
    if (!ok || slow) {
      if (now - this.#lastDecrease < DECREASE_WINDOW_MS) return;
      this.#lastDecrease = now;
      this.#slowStart = false;
      this.#limit = Math.max(this.#o.min, this.#limit * (ok ? 0.9 : 0.5));
      return;
    }
    // Grow only while the limit is what holds sends back (half of it in use), not when traffic is light.
    if (this.inFlight + 1 < this.#limit / 2) return;
    this.#limit = Math.min(this.#o.max, this.#limit + (this.#slowStart ? 1 : 1 / this.#limit));
  }
}
