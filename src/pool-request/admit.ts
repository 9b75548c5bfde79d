// Stage 5, admit: ask the governor for a slot. The wait is X-Service-Queue-Timeout-Ms clamped to the
// pool's queue timeout (its default), or 0 with X-Service-No-Queue; refusal.ts maps refusals to 429/504/503.
import type { Admission, Governor, LazyAbortSignal } from '../governor/governor.js';
import { reply, type Exchange, type Reply, type Stage } from './exchange.js';

const DIGITS = /^\d{1,15}$/;

/** The queue wait this request asks for, or a 400 when the header is not a non-negative integer. */
export function requestedWait(ex: Exchange): number | Reply {
  const max = ex.pool!.settings.queueTimeoutMs;
  const noQueue = ex.headers['x-service-no-queue'];
  if (noQueue !== undefined && noQueue !== '' && noQueue !== '0' && noQueue.toLowerCase() !== 'false') return 0;
  const raw = ex.headers['x-service-queue-timeout-ms'];
  if (raw === undefined || raw === '') return max;
  const v = raw.trim();
  if (!DIGITS.test(v)) return reply(400, 'bad_request', 'X-Service-Queue-Timeout-Ms must be a non-negative integer (milliseconds)');
  return Math.min(Number(v), max);
}

/** The wait stage: the queue wait this request asks for, on the Exchange (waitMs), or the 400. */
export const queueWaitStage: Stage = (ex: Exchange) => {
  const wait = requestedWait(ex);
  if (typeof wait !== 'number') return wait;
  ex.waitMs = wait;
  return null;
};

/** Acquires a slot: synchronous when one is free (no promise on the hot path). */
export function admit(governor: Governor, ex: Exchange, waitMs: number, abortable: LazyAbortSignal): Admission | Promise<Admission> {
  try {
    return governor.acquire({ poolId: ex.pool!.id, waitMs, abortable });
  } catch {
    return { ok: false, reason: 'unavailable', queuedMs: 0 };
  }
}
