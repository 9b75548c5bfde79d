// The refusal mapping: what a governor refusal is answered and recorded as, by every front door (HTTP
// listener, SQL over HTTP, lock API, wire listeners), and the governor headers sent with it.
import type { Admission, Governor, RefusalReason } from '../governor/governor.js';
import { reply, type OutcomeName, type Reply } from './exchange.js';

/** Retry-After in whole seconds, at least 1. */
export function retryAfterSeconds(ms: number | undefined): string {
  return String(Math.max(1, Math.ceil((ms ?? 1000) / 1000)));
}

/** The outcome a refused admission is recorded as by the wire listeners (HTTP and lock answers name it by their reply's error). */
export function refusalOutcome(reason: RefusalReason): OutcomeName {
  switch (reason) {
    case 'aborted':
      return 'client_aborted';
    case 'queue_timeout':
      return 'queue_timeout';
    case 'unavailable':
      return 'unavailable';
    default:
      return 'too_many_requests';
  }
}

/** The HTTP status a refused admission stands for (the wire listeners record it with the outcome; HTTP replies it). */
export function refusalStatus(reason: RefusalReason): number {
  switch (reason) {
    case 'queue_timeout':
      return 504;
    case 'unavailable':
      return 503;
    case 'aborted':
      return 499;
    default:
      return 429;
  }
}

/** The reply for a refused admission; null for `aborted` (the client is gone, nothing to send). */
export function refusalReply(a: Extract<Admission, { ok: false }>, governorHeaders: Array<[string, string]>): Reply | null {
  switch (a.reason) {
    case 'queue_full':
    case 'no_slot':
      return reply(429, 'too_many_requests', a.reason === 'queue_full' ? 'the pool queue is full' : 'no free slot in the pool', [
        ['retry-after', retryAfterSeconds(a.retryAfterMs)],
        ...governorHeaders,
      ]);
    case 'rate_limited':
      return reply(429, 'too_many_requests', "the pool's request rate limit is reached", [
        ['retry-after', retryAfterSeconds(a.retryAfterMs)],
        ...governorHeaders,
      ]);
    case 'queue_timeout':
      return reply(504, 'queue_timeout', 'no slot opened within the queue wait', governorHeaders);
    case 'unavailable':
      if (a.backendDown) return reply(503, 'governor_unavailable', 'the shared governor (Redis) cannot be reached', [['retry-after', retryAfterSeconds(a.retryAfterMs)]]);
      return reply(503, 'unavailable', 'the governor is unavailable', [['retry-after', retryAfterSeconds(a.retryAfterMs)]]);
    case 'aborted':
      return null;
  }
}

/** The governor response headers (spec: x-service-remaining-slots, -effective-limit, -queued-ms). */
export function governorHeaders(governor: Governor, poolId: number, queuedMs: number): Array<[string, string]> {
  const f = appendGovernorHeaders([], governor, poolId, queuedMs);
  return [
    [f[0]!, f[1]!],
    [f[2]!, f[3]!],
    [f[4]!, f[5]!],
  ];
}

/**
 * governorHeaders added to the flat name/value list `out` (a forwarded response's head: no array of its own, no
 * pair per header); returns `out`.
 */
export function appendGovernorHeaders(out: string[], governor: Governor, poolId: number, queuedMs: number): string[] {
  let remaining = 0;
  let limit = 0;
  try {
    const s = governor.state(poolId);
    remaining = s.remaining;
    limit = s.effectiveLimit;
  } catch {
    // A governor that cannot answer (e.g. a remote one that is down) must not fail a response.
  }
  out.push(
    'x-service-remaining-slots',
    String(Math.max(0, remaining)),
    'x-service-effective-limit',
    String(limit),
    'x-service-queued-ms',
    String(Math.round(queuedMs)),
  );
  return out;
}
