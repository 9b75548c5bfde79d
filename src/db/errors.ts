// Database errors as HTTP answers: what the database said about a query becomes a 4xx JSON body carrying
// its SQLSTATE (PostgreSQL) or errno (MySQL); trouble reaching the database becomes 502, 503 or 504.
// Codes and statuses come from the catalogue (src/errors/catalogue.ts).
import { errorBody, httpStatus, type HttpCode, type HttpStatusOf } from '../errors/catalogue.js';

/** The statuses a database's refusal of a statement is answered with (`database_error`). */
export type DatabaseStatus = HttpStatusOf<'database_error'>;

/** Why a SQL request did not produce a result. */
export type DbFailure =
  /** The database refused the statement: the caller's query, data or privileges. */
  | { kind: 'database'; status: DatabaseStatus; code: string; message: string; extra: Record<string, string | number> }
  /** No session: connection refused, DNS, TLS, authentication of the pool's role, lost connection. */
  | { kind: 'unreachable'; message: string }
  /** The pool's requestTimeoutMs passed; the query was cancelled. */
  | { kind: 'timeout'; message: string }
  /** The pool is not configured to reach a database (no credential, no host). */
  | { kind: 'unavailable'; message: string }
  /** The client went away; the query was cancelled and nobody is waiting for an answer. */
  | { kind: 'aborted' };

/** The HTTP answer for a failure: status and JSON body (`aborted` has none: nobody is listening). */
export function failureBody(f: Exclude<DbFailure, { kind: 'aborted' }>): { status: number; body: Record<string, unknown> } {
  switch (f.kind) {
    case 'database':
      return { status: f.status, body: { error: 'database_error' satisfies HttpCode, code: f.code, message: f.message, ...f.extra } };
    case 'unreachable':
      return { status: httpStatus('upstream_unreachable'), body: errorBody('upstream_unreachable', f.message) };
    case 'timeout':
      return { status: httpStatus('upstream_timeout'), body: errorBody('upstream_timeout', f.message) };
    case 'unavailable':
      return { status: httpStatus('unavailable'), body: errorBody('unavailable', f.message) };
  }
}

interface PgError {
  code?: string;
  message?: string;
  detail?: string;
  hint?: string;
  position?: string;
  severity?: string;
}

/** SQLSTATE classes that mean the session, not the statement, failed (connection, auth, server state). */
const PG_UNREACHABLE_CLASSES = new Set(['08', '28', '3D', '53', '58', 'XX']);

/** HTTP status for a PostgreSQL SQLSTATE that the statement caused. */
export function pgStatus(code: string): DatabaseStatus {
  if (code === '42501') return 403; // insufficient_privilege: e.g. a write on a read-only role
  const cls = code.slice(0, 2);
  if (cls === '23' || code === '40001' || code === '40P01') return 409; // constraint; serialization; deadlock
  return 400; // syntax, undefined objects, data exceptions, invalid transaction state, raised exceptions
}

/**
 * A pg error as a failure. Errors with a SQLSTATE are the database's answer; those of the session classes
 * (and errors without a code: sockets, TLS, DNS) are the upstream's trouble.
 */
export function pgFailure(err: unknown): DbFailure {
  const e = (err ?? {}) as PgError;
  const code = typeof e.code === 'string' && /^[0-9A-Z]{5}$/.test(e.code) ? e.code : null;
  const message = e.message || String(err);
  if (code === null) return { kind: 'unreachable', message: `cannot reach the database: ${message}` };
  if (code === '57014') return { kind: 'timeout', message: 'the query was cancelled by the database (statement timeout)' };
  if (PG_UNREACHABLE_CLASSES.has(code.slice(0, 2)) || code.startsWith('57P')) {
    return { kind: 'unreachable', message: `the database refused the session (${code}): ${message}` };
  }
  const extra: Record<string, string | number> = {};
  if (e.detail) extra.detail = e.detail;
  if (e.hint) extra.hint = e.hint;
  if (e.position && /^\d+$/.test(e.position)) extra.position = Number(e.position);
  return { kind: 'database', status: pgStatus(code), code, message, extra };
}

interface MysqlError {
  errno?: number;
  code?: string;
  sqlState?: string;
  sqlMessage?: string;
  message?: string;
  fatal?: boolean;
}

const MYSQL_CONFLICT = new Set([
  1022, 1062, 1169, 1586, // duplicate key
  1216, 1217, 1451, 1452, // foreign key
  1048, 1364, // NOT NULL
  3819, 4025, // CHECK constraint (MySQL, MariaDB)
  1205, 1213, // lock wait timeout, deadlock
]);
const MYSQL_FORBIDDEN = new Set([1044, 1142, 1143, 1227, 1290, 1370, 1792]);
/** Query interrupted (KILL QUERY) and statement time limits (MariaDB max_statement_time, MySQL max_execution_time). */
const MYSQL_TIMEOUT = new Set([1317, 1969, 3024]);
/** Session-level errors: authentication, unknown database, too many connections, server going away. */
const MYSQL_UNREACHABLE = new Set([1040, 1045, 1049, 1053, 1129, 1130, 1203, 1226, 2002, 2003, 2005, 2006, 2013]);

/** HTTP status for a MySQL errno that the statement caused. */
export function mysqlStatus(errno: number): DatabaseStatus {
  if (MYSQL_CONFLICT.has(errno)) return 409;
  if (MYSQL_FORBIDDEN.has(errno)) return 403;
  return 400;
}

/** A mysql2 error as a failure; fatal (connection) errors and session errnos are the upstream's trouble. */
export function mysqlFailure(err: unknown): DbFailure {
  const e = (err ?? {}) as MysqlError;
  const message = e.sqlMessage || e.message || String(err);
  const errno = typeof e.errno === 'number' ? e.errno : null;
  if (errno !== null && MYSQL_TIMEOUT.has(errno)) return { kind: 'timeout', message: 'the query was interrupted by the database' };
  if (errno === null || e.fatal || MYSQL_UNREACHABLE.has(errno)) {
    return { kind: 'unreachable', message: `cannot reach the database: ${message}` };
  }
  const extra: Record<string, string | number> = {};
  if (e.sqlState) extra.sqlstate = e.sqlState;
  return { kind: 'database', status: mysqlStatus(errno), code: String(errno), message, extra };
}
