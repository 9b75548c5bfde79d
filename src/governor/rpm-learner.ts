// The RPM learner and gate of one pool: learns the upstream's requests-per-minute from what it says, and
// admits at most that many per minute (a token bucket), pausing while the upstream asked us to wait.
import type { RateInfo } from './rate-headers.js';

export interface RpmLearnerOptions {
  /** The gate admits this fraction of the learned rate: headroom for the upstream counting differently. */
  margin?: number;
  /** Bucket capacity in seconds of the gate rate (at least one request): how much burst a quiet pool may send. */
  burstSeconds?: number;
  /** Longest pause one retry hint or exhausted window imposes; a later answer may pause again. */
  maxPauseMs?: number;
}

const MINUTE_MS = 60_000;

/**
 * Learns and enforces a request rate. `observe()` takes what one upstream answer said (parsed headers
 * or a lock release's `rate` object): a stated limit becomes the learned RPM (scaled to a minute when
 * the policy names its window, else taken as per minute, as OpenAI and Anthropic state theirs); a
 * retry hint, or a window with nothing `remaining`, pauses admissions until then. An override fixes
 * the rate whatever is learned; pauses still apply (the upstream asked us to wait).
 *
 * The gate is a token bucket at `margin · rpm` per minute holding at most `burstSeconds` of that rate,
 * so in any minute it admits at most about the learned figure. Pure and O(1): time comes in with each
 * call, nothing is allocated.
 */
export class RpmLearner {
  readonly #margin: number;
  readonly #burstSeconds: number;
  readonly #maxPauseMs: number;
  #learned = NaN;
  #tokenLimit = NaN;
  #override: number | null = null;
  /** Tokens per ms; 0 means no rate gate. */
  #rate = 0;
  #capacity = 0;
  #tokens = 0;
  #refilledAt = 0;
  #pausedUntil = -Infinity;

  constructor(opts: RpmLearnerOptions = {}) {
    this.#margin = opts.margin ?? 0.97;
    this.#burstSeconds = opts.burstSeconds ?? 1;
    this.#maxPauseMs = opts.maxPauseMs ?? 300_000;
  }

  /** Requests per minute the upstream stated; NaN until it said. */
  get learnedRpm(): number {
    return this.#learned;
  }

  /** Tokens per minute the upstream stated; NaN until it said (recorded, not gated). */
  get tokenLimit(): number {
    return this.#tokenLimit;
  }

  /** The rate the gate enforces, per minute; NaN when nothing gates the rate. */
  get gateRpm(): number {
    return this.#rate > 0 ? this.#rate * MINUTE_MS : NaN;
  }

  /** Admissions are paused until this time (ms, the caller's clock); -Infinity when not paused. */
  get pausedUntil(): number {
    return this.#pausedUntil;
  }

  /** Fixes the gate at `rpm` (null hands it back to the learner). */
  setOverride(rpm: number | null, now: number): void {
    const next = rpm !== null && rpm > 0 && Number.isFinite(rpm) ? rpm : null;
    if (next === this.#override) return;
    this.#override = next;
    this.#retune(now, NaN);
  }

  /** What one upstream answer said; `info.retryAfterMs` only when it is a wait-before-retry for this pool. */
  observe(now: number, info: RateInfo): void {
    if (info.retryAfterMs >= 0) this.#pause(now, info.retryAfterMs);
    if (info.limit >= 1) {
      const windowMs = info.windowMs > 0 ? info.windowMs : MINUTE_MS;
      const rpm = (info.limit * MINUTE_MS) / windowMs;
      if (rpm !== this.#learned) {
        this.#learned = rpm;
        this.#retune(now, info.remaining);
      }
    }
    if (info.tokenLimit >= 0) this.#tokenLimit = info.tokenLimit;
    // The window is spent: nothing more goes until it resets.
    if (info.remaining === 0 && info.resetMs >= 0) this.#pause(now, info.resetMs);
  }

  /** Whether one more request may go now. */
  allows(now: number): boolean {
    if (now < this.#pausedUntil) return false;
    if (this.#rate === 0) return true;
    this.#refill(now);
    return this.#tokens >= 1;
  }

  /** Counts one admitted request (call after `allows`). */
  take(now: number): void {
    if (this.#rate === 0) return;
    this.#refill(now);
    this.#tokens -= 1;
  }

  /** Ms until `allows` can be true again; 0 when it is now. */
  waitMs(now: number): number {
    const pause = this.#pausedUntil - now;
    let wait = pause > 0 ? pause : 0;
    if (this.#rate > 0) {
      this.#refill(now);
      const forToken = this.#tokens >= 1 ? 0 : (1 - this.#tokens) / this.#rate;
      if (forToken > wait) wait = forToken;
    }
    return wait;
  }

  #pause(now: number, ms: number): void {
    const until = now + Math.min(ms, this.#maxPauseMs);
    if (until > this.#pausedUntil) this.#pausedUntil = until;
  }

  #refill(now: number): void {
    const dt = now - this.#refilledAt;
    this.#refilledAt = now;
    if (dt > 0) this.#tokens = Math.min(this.#capacity, this.#tokens + dt * this.#rate);
  }

  /** A new rate: keeps the tokens already earned (within the new capacity), or starts from `remaining`. */
  #retune(now: number, remaining: number): void {
    const hadRate = this.#rate > 0;
    if (hadRate) this.#refill(now);
    const rpm = this.#override ?? this.#learned * this.#margin;
    if (!(rpm > 0)) {
      this.#rate = 0;
      return;
    }
    this.#rate = rpm / MINUTE_MS;
    this.#capacity = Math.max(1, (rpm * this.#burstSeconds) / 60);
    this.#refilledAt = now;
    this.#tokens = hadRate ? Math.min(this.#tokens, this.#capacity) : Math.min(this.#capacity, remaining >= 0 ? remaining : this.#capacity);
  }
}
