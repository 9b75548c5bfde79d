// The fixed limits of async jobs (documented in docs/jobs-and-webhooks.md).

/** Largest request body spilled with a job; larger is 413 (a job's request lives in one store row). */
export const JOB_BODY_CAP = 1024 * 1024;
/** Largest stored result body; the rest is cut and the result marked truncated. */
export const RESULT_BODY_CAP = 8 * 1024 * 1024;
/** Results inline in events and poll answers up to this many bytes of UTF-8 (spec: 256 KiB). */
export const INLINE_BODY_CAP = 256 * 1024;
/** Upstream attempts before a job that never got an answer is `failed`. */
export const MAX_ATTEMPTS = 3;
/** First retry's backoff before jitter. */
export const RETRY_BASE_MS = 1000;
/** Backoff before attempt n+1 (n = attempts so far): base, base×4, … ×4, ±25 % jitter (1 s, 4 s by default). */
export function retryDelayMs(attempts: number, baseMs: number = RETRY_BASE_MS, random: () => number = Math.random): number {
  const base = baseMs * 4 ** Math.max(0, attempts - 1);
  return Math.round(base * (0.75 + random() * 0.5));
}
/** A claim lease outlives the whole upstream exchange (bounded by the pool's requestTimeoutMs) by this. */
export const LEASE_MARGIN_MS = 30_000;
/** Jobs one runner runs at once across every pool (bounds result buffers in memory). */
export const RUNNER_MAX_IN_FLIGHT = 64;
/** Finished jobs (and their results) are kept this long after their terminal status, then deleted. */
export const JOB_RETENTION_MS = 7 * 86_400_000;
/** The NOTIFY channel that wakes runners when a job is spilled (payload: pool id). */
export const JOBS_CHANNEL = 'poolgate_jobs';
