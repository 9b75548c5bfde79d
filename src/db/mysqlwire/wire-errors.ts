// The MySQL listener's error catalogue: every refusal poolgate itself answers, as errno + SQLSTATE
// (docs/decisions/mysqlwire.md lists them). Errors from the database travel as the database sent them.
import type { RefusalReason } from '../../governor/governor.js';
import { errPacket } from './packets.js';

export const WIRE_ERROR = {
  /** Unknown pool, wrong or expired key, pool suspended or not a MySQL pool. */
  accessDenied: [1045, '28000'],
  /** A database other than the pool's (handshake or COM_INIT_DB). */
  dbAccessDenied: [1044, '42000'],
  /** The pool's policies refuse this client address. */
  hostNotAllowed: [1130, 'HY000'],
  /** Malformed handshake. */
  badHandshake: [1043, '08S01'],
  /** A client packet over the limit (or a split 16 MiB packet). */
  packetTooLarge: [1153, '08S01'],
  /** A command packet whose sequence id is not 0: the client and poolgate disagree on where a command starts. */
  packetsOutOfOrder: [1156, '08S01'],
  /** A command byte poolgate does not know. */
  unknownCommand: [1047, '08S01'],
  /** A command poolgate refuses: COM_CHANGE_USER, binlog/replication, cursors, ... */
  notSupported: [1235, '42000'],
  /** COM_STMT_EXECUTE / SEND_LONG_DATA of a statement id this client never prepared. */
  unknownStatement: [1243, 'HY000'],
  /** Governor: the pool's queue is full, or no slot opened within the queue wait. */
  tooBusy: [1040, '08004'],
  /** Governor: the pool's RPM gate is shut. */
  rateLimited: [1226, '42000'],
  /** Governor unavailable (shared governor's Redis down). */
  unavailable: [1053, '08S01'],
  // Only server error numbers: 2000-2999 are the client library's own (CR_*), and libmariadb shows a server
  // ERR carrying one as `ERROR 2027 Received malformed packet` instead of poolgate's message.
  /** The upstream database cannot be reached or refuses the pool's role (ER_CONNECT_TO_FOREIGN_DATA_SOURCE). */
  cannotConnect: [1429, 'HY000'],
  /** The upstream connection broke during the command; any open transaction is gone, rolled back (ER_QUERY_INTERRUPTED). */
  lostConnection: [1317, '70100'],
  /** A transaction idle between statements longer than the pool's requestTimeoutMs: rolled back, session closed. */
  idleInTransaction: [4031, 'HY000'],
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
