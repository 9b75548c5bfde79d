// The queue wait an acquire asks for (spec: acquire `waitMs`, X-Service-Queue-Timeout-Ms, X-Service-No-Queue).
import type { Parsed } from './outcome.js';

const isCount = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

const DIGITS = /^\d{1,15}$/;

/**
 * The queue wait of an acquire, in ms, clamped to the pool's queue timeout: X-Service-No-Queue → 0; body
 * `waitMs`, else header X-Service-Queue-Timeout-Ms; neither → 0 (fail fast).
 */
export function acquireWait(body: Record<string, unknown>, headers: Record<string, string>, queueTimeoutMs: number): Parsed<number> {
  for (const k of Object.keys(body)) {
    if (k !== 'waitMs') return { ok: false, message: `unknown member ${JSON.stringify(k)}; allowed: waitMs` };
  }
  let wait = 0;
  if (body.waitMs !== undefined) {
    if (!isCount(body.waitMs)) return { ok: false, message: 'waitMs must be an integer ≥ 0 (milliseconds)' };
    wait = body.waitMs;
  } else {
    const raw = headers['x-service-queue-timeout-ms'];
    if (raw !== undefined && raw !== '') {
      const v = raw.trim();
      if (!DIGITS.test(v)) return { ok: false, message: 'X-Service-Queue-Timeout-Ms must be a non-negative integer (milliseconds)' };
      wait = Number(v);
    }
  }
  const noQueue = headers['x-service-no-queue'];
  if (noQueue !== undefined && noQueue !== '' && noQueue !== '0' && noQueue.toLowerCase() !== 'false') return { ok: true, value: 0 };
  return { ok: true, value: Math.min(wait, queueTimeoutMs) };
}
