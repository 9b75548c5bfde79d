// The errors the listener itself sends: each SQLSTATE comes from the one catalogue (src/errors/catalogue.ts,
// docs/errors.md); these names are the listener's own words for them.
// Each failure a client can cause is one of these: a clear code and message, and nothing changed upstream.
import type { RefusalReason } from '../../governor/governor.js';
import { pgState } from '../../errors/catalogue.js';
import { errorResponse } from './messages.js';

export const SQLSTATE = {
  /** Malformed, truncated or out-of-order frames; oversized messages. */
  protocolViolation: pgState('protocol_violation'),
  /** No pool named, or the pool cannot take wire connections (http pool, suspended, no role attached). */
  rejectedEstablishment: pgState('connection_rejected'),
  /** The named pool does not exist. */
  unknownPool: pgState('not_found'),
  /** Wrong, missing or expired pool key. */
  invalidPassword: pgState('unauthorized'),
  /** The key or client may not use this pool (read key, IP allowlist, request-shaped policies). */
  invalidAuthorization: pgState('forbidden'),
  /** The governor refused a slot (queue full, queue timeout). */
  tooManyConnections: pgState('too_many_requests'),
  /** The pool's requests-per-minute gate is shut. */
  rateLimited: pgState('rate_limited'),
  /** The listener is shutting down (the shared governor's refusal has the same SQLSTATE: see refusal()). */
  cannotConnectNow: pgState('shutting_down'),
  /** The upstream database cannot be reached or refused our role. */
  upstreamUnavailable: pgState('upstream_unreachable'),
  /** The upstream server connection was lost mid-transaction (its transaction is rolled back). */
  upstreamLost: pgState('upstream_lost'),
  /** A fault of the listener itself while serving this client (logged); only that connection ends. */
  internalError: pgState('internal_error'),
  /** A feature the listener does not offer (replication, protocol versions other than 3.0...). */
  featureNotSupported: pgState('not_implemented'),
} as const;

export function fatal(code: string, message: string): Buffer {
  return errorResponse(code, message, 'FATAL');
}

export function error(code: string, message: string): Buffer {
  return errorResponse(code, message, 'ERROR');
}

/** The SQLSTATE and message of a governor refusal. */
export function refusal(reason: RefusalReason, pool: string, waitMs: number): { code: string; message: string } {
  switch (reason) {
    case 'queue_full':
    case 'no_slot':
      return { code: SQLSTATE.tooManyConnections, message: `pool ${pool} is at its concurrency limit and its queue is full; try again later` };
    case 'queue_timeout':
      return { code: pgState('queue_timeout'), message: `pool ${pool} had no free slot within its queue timeout (${waitMs} ms); try again later` };
    case 'rate_limited':
      return { code: SQLSTATE.rateLimited, message: `pool ${pool} is over its requests-per-minute limit; try again later` };
    case 'unavailable':
    case 'aborted':
      return { code: pgState('governor_unavailable'), message: `pool ${pool} cannot admit transactions right now (governor unavailable); try again later` };
  }
}
