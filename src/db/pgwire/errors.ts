// The errors the listener itself sends, with their SQLSTATEs (the catalogue in docs/decisions/pgwire.md).
// Each failure a client can cause is one of these: a clear code and message, and nothing changed upstream.
import type { RefusalReason } from '../../governor/governor.js';
import { errorResponse } from './messages.js';

export const SQLSTATE = {
  /** Malformed, truncated or out-of-order frames; oversized messages. */
  protocolViolation: '08P01',
  /** No pool named, or the pool cannot take wire connections (http pool, suspended, no role attached). */
  rejectedEstablishment: '08004',
  /** The named pool does not exist. */
  unknownPool: '3D000',
  /** Wrong, missing or expired pool key. */
  invalidPassword: '28P01',
  /** The key or client may not use this pool (read key, IP allowlist, request-shaped policies). */
  invalidAuthorization: '28000',
  /** The governor refused a slot (queue full, queue timeout). */
  tooManyConnections: '53300',
  /** The pool's requests-per-minute gate is shut. */
  rateLimited: '53400',
  /** The shared governor (Redis) is unreachable, or the listener is shutting down. */
  cannotConnectNow: '57P03',
  /** The upstream database cannot be reached or refused our role. */
  upstreamUnavailable: '08001',
  /** The upstream server connection was lost mid-transaction (its transaction is rolled back). */
  upstreamLost: '08006',
  /** A fault of the listener itself while serving this client (logged); only that connection ends. */
  internalError: 'XX000',
  /** A feature the listener does not offer (replication, protocol versions other than 3.0...). */
  featureNotSupported: '0A000',
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
      return { code: SQLSTATE.tooManyConnections, message: `pool ${pool} had no free slot within its queue timeout (${waitMs} ms); try again later` };
    case 'rate_limited':
      return { code: SQLSTATE.rateLimited, message: `pool ${pool} is over its requests-per-minute limit; try again later` };
    case 'unavailable':
    case 'aborted':
      return { code: SQLSTATE.cannotConnectNow, message: `pool ${pool} cannot admit transactions right now (governor unavailable); try again later` };
  }
}
