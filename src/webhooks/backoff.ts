// The retry schedule of a failed delivery: exponential backoff with full jitter (a uniformly random
// wait between 0 and min(cap, base · 2^(attempt−1))), so many failed deliveries do not retry in step.

export interface RetrySchedule {
  /** Ceiling of the wait after the first failure, in ms. */
  baseMs: number;
  /** Largest ceiling, in ms. */
  capMs: number;
  /** Attempts after which a delivery is given up (its row dropped; the history keeps every attempt). */
  maxAttempts: number;
}

/** Wait before the next attempt, after `attempt` attempts have failed (attempt ≥ 1). `random` ∈ [0, 1). */
export function retryDelayMs(s: RetrySchedule, attempt: number, random: () => number = Math.random): number {
  const ceiling = Math.min(s.capMs, s.baseMs * 2 ** Math.min(attempt - 1, 40));
  return Math.floor(random() * ceiling);
}
