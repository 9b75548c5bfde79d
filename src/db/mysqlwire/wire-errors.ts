// The MySQL listener's errors: every refusal poolgate itself answers, as errno + SQLSTATE taken from the one
// catalogue (src/errors/catalogue.ts, docs/errors.md); these names are the listener's own words for them.
// Errors from the database travel as the database sent them.
import type { RefusalReason } from '../../governor/governor.js';
import { mysqlError } from '../../errors/catalogue.js';
import { errPacket } from './packets.js';

export const WIRE_ERROR = {
  /** Unknown pool, wrong or expired key, pool suspended or not a MySQL pool (1045 does not say which). */
  accessDenied: mysqlError('unauthorized'),
  /** A database other than the pool's (handshake or COM_INIT_DB). */
  dbAccessDenied: mysqlError('wrong_database'),
  /** The pool's policies refuse this client address. */
  hostNotAllowed: mysqlError('forbidden'),
  /** Malformed handshake. */
  badHandshake: mysqlError('protocol_violation'),
  /** A client packet over the limit (or a split 16 MiB packet). */
  packetTooLarge: mysqlError('payload_too_large'),
  /** A command packet whose sequence id is not 0: the client and poolgate disagree on where a command starts. */
  packetsOutOfOrder: mysqlError('packets_out_of_order'),
  /** A command byte poolgate does not know. */
  unknownCommand: mysqlError('unknown_command'),
  /** A command poolgate refuses: COM_CHANGE_USER, binlog/replication, cursors, ... */
  notSupported: mysqlError('not_implemented'),
  /** COM_STMT_EXECUTE / SEND_LONG_DATA of a statement id this client never prepared. */
  unknownStatement: mysqlError('unknown_statement'),
  /** KILL of an id that is not one of the client's own sessions (poolgate's greeting ids, never server thread ids). */
  unknownThread: mysqlError('unknown_thread'),
  /** Governor: the pool's queue is full, or no slot opened within the queue wait (both 1040). */
  tooBusy: mysqlError('too_many_requests'),
  /** Governor: the pool's RPM gate is shut. */
  rateLimited: mysqlError('rate_limited'),
  /** Governor unavailable (shared governor's Redis down). */
  unavailable: mysqlError('governor_unavailable'),
  /** The upstream database cannot be reached or refuses the pool's role (ER_CONNECT_TO_FOREIGN_DATA_SOURCE). */
  cannotConnect: mysqlError('upstream_unreachable'),
  /** The upstream connection broke during the command; any open transaction is gone, rolled back (ER_QUERY_INTERRUPTED). */
  lostConnection: mysqlError('upstream_lost'),
  /** A transaction idle between statements longer than the pool's requestTimeoutMs: rolled back, session closed. */
  idleInTransaction: mysqlError('idle_in_transaction'),
} as const satisfies Record<string, readonly [number, string]>;

export type WireError = keyof typeof WIRE_ERROR;

export function wireError(seq: number, e: WireError, message: string): Buffer {
  const [errno, state] = WIRE_ERROR[e];
  return errPacket(seq, errno, state, message);
}

/** The ERR a governor refusal becomes. */
export function refusalError(seq: number, reason: RefusalReason, pool: string, queuedMs: number): Buffer {
  switch (reason) {
    case 'queue_full':
      return wireError(seq, 'tooBusy', `pool ${pool}: the pool queue is full`);
    case 'no_slot':
      return wireError(seq, 'tooBusy', `pool ${pool}: no free slot`);
    case 'queue_timeout':
      return wireError(seq, 'tooBusy', `pool ${pool}: no slot opened within the queue wait (${Math.round(queuedMs)} ms)`);
    case 'rate_limited':
      return wireError(seq, 'rateLimited', `pool ${pool}: the request rate limit is reached`);
    case 'unavailable':
    case 'aborted':
      return wireError(seq, 'unavailable', `pool ${pool}: the governor is unavailable`);
  }
}
