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

/** Slots of the state: learned RPM, token limit, override (NaN: none), rate (tokens per ms; 0: no gate), capacity, tokens, refilled at, paused until. */
export const RPM_STATE_SIZE = 8;
const LEARNED = 0;
const TOKEN_LIMIT = 1;
const OVERRIDE = 2;
const RATE = 3;
const CAPACITY = 4;
const TOKENS = 5;
const REFILLED_AT = 6;
const PAUSED_UNTIL = 7;
/** Nothing learned, no override, no gate, not paused. */
const INITIAL_STATE = [NaN, NaN, NaN, 0, 0, 0, 0, -Infinity];

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

  /** The learned state and the bucket, indexed by the slot names below (direct indexing: accessors would cost 10×). */
  readonly #s: Float64Array;

  /**
   * `store` (RPM_STATE_SIZE long) holds the learned rate and the bucket, so a view into shared memory
   * gives every thread one gate; `init` false attaches to a state another thread set up (same options).
   */
  constructor(opts: RpmLearnerOptions = {}, store: Float64Array = new Float64Array(RPM_STATE_SIZE), init = true) {
    this.#margin = opts.margin ?? 0.97;
    this.#burstSeconds = opts.burstSeconds ?? 1;
    this.#maxPauseMs = opts.maxPauseMs ?? 300_000;
    this.#s = store;
    if (init) store.set(INITIAL_STATE);
  }

  /** Requests per minute the upstream stated; NaN until it said. */
  get learnedRpm(): number {
    return this.#s[LEARNED];
  }

  /** Tokens per minute the upstream stated; NaN until it said (recorded, not gated). */
  get tokenLimit(): number {
    return this.#s[TOKEN_LIMIT];
  }

  /** The rate the gate enforces, per minute; NaN when nothing gates the rate. */
  get gateRpm(): number {
    return this.#s[RATE] > 0 ? this.#s[RATE] * MINUTE_MS : NaN;
  }

  /** Admissions are paused until this time (ms, the caller's clock); -Infinity when not paused. */
  get pausedUntil(): number {
    return this.#s[PAUSED_UNTIL];
  }

  /** Fixes the gate at `rpm` (null hands it back to the learner). */
  setOverride(rpm: number | null, now: number): void {
    const next = rpm !== null && rpm > 0 && Number.isFinite(rpm) ? rpm : NaN;
    // NaN in the store means no override.
    if (next === this.#s[OVERRIDE] || (Number.isNaN(next) && Number.isNaN(this.#s[OVERRIDE]))) return;
    this.#s[OVERRIDE] = next;
    this.#retune(now, NaN);
  }

  /** What one upstream answer said; `info.retryAfterMs` only when it is a wait-before-retry for this pool. */
  observe(now: number, info: RateInfo): void {
    if (info.retryAfterMs >= 0) this.#pause(now, info.retryAfterMs);
    if (info.limit >= 1) {
      const windowMs = info.windowMs > 0 ? info.windowMs : MINUTE_MS;
      const rpm = (info.limit * MINUTE_MS) / windowMs;
      if (rpm !== this.#s[LEARNED]) {
        this.#s[LEARNED] = rpm;
        this.#retune(now, info.remaining);
      }
    }
    if (info.tokenLimit >= 0) this.#s[TOKEN_LIMIT] = info.tokenLimit;
    // The window is spent: nothing more goes until it resets.
    if (info.remaining === 0 && info.resetMs >= 0) this.#pause(now, info.resetMs);
  }

  /** Whether one more request may go now. */
  allows(now: number): boolean {
    if (now < this.#s[PAUSED_UNTIL]) return false;
    if (this.#s[RATE] === 0) return true;
    this.#refill(now);
    return this.#s[TOKENS] >= 1;
  }

  /** Counts one admitted request (call after `allows`). */
  take(now: number): void {
    if (this.#s[RATE] === 0) return;
    this.#refill(now);
    this.#s[TOKENS] -= 1;
  }

  /** Ms until `allows` can be true again; 0 when it is now. */
  waitMs(now: number): number {
    const pause = this.#s[PAUSED_UNTIL] - now;
    let wait = pause > 0 ? pause : 0;
    if (this.#s[RATE] > 0) {
      this.#refill(now);
      const forToken = this.#s[TOKENS] >= 1 ? 0 : (1 - this.#s[TOKENS]) / this.#s[RATE];
      if (forToken > wait) wait = forToken;
    }
    return wait;
  }

  #pause(now: number, ms: number): void {
    const until = now + Math.min(ms, this.#maxPauseMs);
    if (until > this.#s[PAUSED_UNTIL]) this.#s[PAUSED_UNTIL] = until;
  }

  #refill(now: number): void {
    const dt = now - this.#s[REFILLED_AT];
    this.#s[REFILLED_AT] = now;
    if (dt > 0) this.#s[TOKENS] = Math.min(this.#s[CAPACITY], this.#s[TOKENS] + dt * this.#s[RATE]);
  }

  /** A new rate: keeps the tokens already earned (within the new capacity), or starts from `remaining`. */
  #retune(now: number, remaining: number): void {
    const hadRate = this.#s[RATE] > 0;
    if (hadRate) this.#refill(now);
    const override = this.#s[OVERRIDE];
    const rpm = Number.isNaN(override) ? this.#s[LEARNED] * this.#margin : override;
    if (!(rpm > 0)) {
      this.#s[RATE] = 0;
      return;
    }
    this.#s[RATE] = rpm / MINUTE_MS;
    this.#s[CAPACITY] = Math.max(1, (rpm * this.#burstSeconds) / 60);
    this.#s[REFILLED_AT] = now;
    this.#s[TOKENS] = hadRate ? Math.min(this.#s[TOKENS], this.#s[CAPACITY]) : Math.min(this.#s[CAPACITY], remaining >= 0 ? remaining : this.#s[CAPACITY]);
  }
}
