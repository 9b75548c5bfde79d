// The one error catalogue: every error poolgate itself answers, by a stable code, with what it is on each
// wire: the HTTP status (data plane, lock API, job polling, SQL over HTTP, Control API), the PostgreSQL
// SQLSTATE (pgwire listener) and the MySQL errno + SQLSTATE (mysqlwire listener). Errors the database sends
// travel as it sent them (`database_error`). docs/errors.md is generated from this table
// (`npm run docs:errors`); test/errors-catalogue.test.ts keeps the two equal.
//
// The HTTP codes are a contract: the data plane, lock API and job polling send them as `error` in the body,
// and clients branch on them (the spec names several). Renaming one is a breaking change. The Control API's
// body is `{ message }` only (spec): there the code only chooses the status.

export interface ErrorEntry {
  /** Where the error travels over HTTP: its status, and any other status the same code is sent with. */
  readonly http?: { readonly status: number; readonly also?: readonly number[] };
  /** The SQLSTATE of the pgwire listener's ErrorResponse. */
  readonly pg?: string;
  /** The mysqlwire listener's ERR packet: server errno (never a 2000–2999 client one) and SQLSTATE. */
  readonly mysql?: { readonly errno: number; readonly sqlstate: string };
  /** The usual message; call sites often say more (which pool, which limit). */
  readonly message: string;
  /** One line: when poolgate answers this. */
  readonly when: string;
}

export const ERRORS = {
  // ── Client input ──
  bad_request: {
    // 431 and 505 keep `bad_request` (tested, and clients see one code for "fix the request"): an HTTP parser
    // refusal has no code of its own.
    http: { status: 400, also: [431, 505] },
    message: 'bad request',
    when: 'a malformed request: framing, target, a header value, a JSON body; 431 for too many or too large headers, 505 for an HTTP version other than 1.0/1.1',
  },
  protocol_violation: {
    pg: '08P01',
    mysql: { errno: 1043, sqlstate: '08S01' },
    message: 'protocol violation',
    when: 'wire listeners: bad length, malformed or out-of-place startup/handshake/password message, a login that does not finish in time',
  },
  packets_out_of_order: {
    mysql: { errno: 1156, sqlstate: '08S01' },
    message: 'Got packets out of order',
    when: 'a MySQL command packet whose sequence id is not 0',
  },
  unknown_command: {
    mysql: { errno: 1047, sqlstate: '08S01' },
    message: 'unknown command',
    when: 'a MySQL command byte poolgate does not know, or a malformed command',
  },
  unknown_statement: {
    mysql: { errno: 1243, sqlstate: 'HY000' },
    message: 'Unknown prepared statement handler',
    when: 'COM_STMT_EXECUTE / RESET / SEND_LONG_DATA of a statement id this client never prepared',
  },
  unknown_thread: {
    mysql: { errno: 1094, sqlstate: 'HY000' },
    message: 'Unknown thread id',
    when: 'a MySQL KILL of an id that is not one of this client\'s sessions (same pool, same key); a KILL poolgate cannot map is refused as not supported',
  },
  payload_too_large: {
    http: { status: 413 },
    mysql: { errno: 1153, sqlstate: '08S01' },
    message: 'request body too large',
    when: 'a request body (or signed body, job body, lock acquire body) over its limit; a MySQL packet of 16 MiB or more',
  },
  request_timeout: {
    http: { status: 408 },
    message: 'request timed out',
    when: 'the request was not received in time: the Control API\'s and the proxy port\'s header timeout (Node\'s HTTP parser), a proxied request body idle past POOLGATE_PROXY_BODY_TIMEOUT_MS',
  },
  method_not_allowed: {
    http: { status: 405 },
    message: 'method not allowed',
    when: 'a method the endpoint does not take: lock API (POST), job polling (GET, HEAD), SQL over HTTP (POST)',
  },
  not_implemented: {
    http: { status: 501 },
    pg: '0A000',
    mysql: { errno: 1235, sqlstate: '42000' },
    message: 'not supported by poolgate',
    when: 'a transfer coding other than chunked; on the wire listeners a feature poolgate does not offer (replication, other protocol versions, COM_CHANGE_USER, cursors) or a session-state statement under wireSessionState \'refuse\'',
  },
  unprocessable: {
    http: { status: 422 },
    message: 'validation failed',
    when: 'Control API validation: invalid origin, host refused, name taken, invalid URL, plan gate, cap reached, credential mismatch',
  },

  // ── Who is asking ──
  unauthorized: {
    // Spec (Lock API errors): an IP allowlist miss on acquire is 403 with this code, not `forbidden`.
    http: { status: 401, also: [403] },
    pg: '28P01',
    mysql: { errno: 1045, sqlstate: '28000' },
    message: 'missing or invalid pool key',
    when: 'a missing, wrong, revoked or expired key or API token, a bad signature or a nonce replay (lock API and job polling: also a policy refusal, 403); MySQL answers 1045 for every login refusal but the IP allowlist, so it does not say whether a pool exists',
  },
  forbidden: {
    http: { status: 403 },
    pg: '28000',
    mysql: { errno: 1130, sqlstate: 'HY000' },
    message: 'forbidden',
    when: 'the key or client may not do this: a read-only key outside its scope, the IP allowlist, a pool policy; Control API: the token or actor lacks the right; wire listeners: a read key, or an HTTP-only policy (pgwire)',
  },
  wrong_database: {
    mysql: { errno: 1044, sqlstate: '42000' },
    message: 'Access denied to database',
    when: 'a MySQL client names a database other than its pool\'s (handshake or COM_INIT_DB)',
  },

  // ── What is asked for ──
  not_found: {
    http: { status: 404 },
    pg: '3D000',
    message: 'not found',
    when: 'no pool at this host or name (pgwire: the named pool does not exist or was deleted), no such lock slot, job, or Control API resource',
  },
  connection_rejected: {
    pg: '08004',
    message: 'the pool cannot take this connection',
    when: 'pgwire: no pool named, the pool is not a PostgreSQL pool, is suspended, or has no database role attached',
  },
  gone: {
    http: { status: 410 },
    message: 'gone',
    when: 'Control API: a sign-in link or intake that was already used or has expired',
  },
  capped: {
    http: { status: 409 },
    message: 'the slot reached its request deadline; release it',
    when: 'lock API renew: the slot hit its request-timeout cap',
  },
  not_ready: {
    http: { status: 409 },
    message: 'the job has not finished',
    when: 'job polling: the job\'s result was asked for before it finished',
  },
  no_result: {
    http: { status: 409 },
    message: 'the job has no result',
    when: 'job polling: the job finished without a result (failed or cancelled)',
  },

  // ── The pool's limits (the governor) ──
  too_many_requests: {
    http: { status: 429 },
    pg: '53300',
    mysql: { errno: 1040, sqlstate: '08004' },
    message: 'no free slot in the pool',
    when: 'the governor refused a slot: the queue is full, no free slot (no-queue), or (HTTP only) the requests-per-minute gate is shut; may carry Retry-After',
  },
  rate_limited: {
    pg: '53400',
    mysql: { errno: 1226, sqlstate: '42000' },
    message: "the pool's request rate limit is reached",
    when: 'wire listeners: the pool\'s requests-per-minute gate is shut (over HTTP this is too_many_requests)',
  },
  queue_timeout: {
    http: { status: 504 },
    pg: '53300',
    mysql: { errno: 1040, sqlstate: '08004' },
    message: 'no slot opened within the queue wait',
    when: 'the request waited its queue timeout (or waitMs) and no slot opened',
  },
  governor_unavailable: {
    http: { status: 503 },
    pg: '57P03',
    mysql: { errno: 1053, sqlstate: '08S01' },
    message: 'the shared governor (Redis) cannot be reached',
    when: 'the shared governor\'s Redis cannot be reached and the pool fails closed; may carry Retry-After',
  },
  unavailable: {
    http: { status: 503 },
    message: 'unavailable',
    when: 'the pool is suspended or has no usable origin or credential, the governor or a store cannot take the request now; Control API: rotate failed (edge projection)',
  },
  shutting_down: {
    pg: '57P03',
    message: 'poolgate is shutting down',
    when: 'pgwire: poolgate is shutting down and closes every client',
  },

  // ── The upstream (origin or database) ──
  upstream_unreachable: {
    http: { status: 502 },
    pg: '08001',
    mysql: { errno: 1429, sqlstate: 'HY000' },
    message: 'the upstream could not be reached',
    when: 'the origin or database cannot be reached, or refuses the pool\'s role (connection refused, DNS, TLS, authentication)',
  },
  upstream_timeout: {
    http: { status: 504 },
    message: 'the upstream did not answer within the request timeout',
    when: 'the origin or database did not answer within the pool\'s requestTimeoutMs (the query is cancelled)',
  },
  upstream_lost: {
    pg: '08006',
    mysql: { errno: 1317, sqlstate: '70100' },
    message: 'the server connection was lost',
    when: 'wire listeners: the server connection broke during a command or transaction (it is rolled back)',
  },
  idle_in_transaction: {
    mysql: { errno: 4031, sqlstate: 'HY000' },
    message: 'the transaction was idle too long and was rolled back',
    when: 'a MySQL transaction idle between statements longer than the pool\'s requestTimeoutMs (session closed)',
  },
  database_error: {
    // The status is chosen from the database's code (src/db/errors.ts): 403 privileges, 409 conflicts, else 400.
    http: { status: 400, also: [403, 409] },
    message: 'the database refused the statement',
    when: 'SQL over HTTP: the database refused the statement; the body carries its SQLSTATE or errno as `code` (the wire listeners forward such errors as the database sent them)',
  },

  // ── poolgate itself ──
  internal_error: {
    http: { status: 500 },
    pg: 'XX000',
    message: 'internal error',
    when: 'a fault of poolgate itself while serving this request (logged); only that request or connection ends',
  },
} as const satisfies Record<string, ErrorEntry>;

type Catalogue = typeof ERRORS;

/** Every code in the catalogue. */
export type ErrorCode = keyof Catalogue;
/** Codes that travel over HTTP (the only ones an HTTP `error` field or an ApiError may carry). */
export type HttpCode = { [C in ErrorCode]: Catalogue[C] extends { http: object } ? C : never }[ErrorCode];
/** Codes the pgwire listener answers with a SQLSTATE of its own. */
export type PgCode = { [C in ErrorCode]: Catalogue[C] extends { pg: string } ? C : never }[ErrorCode];
/** Codes the mysqlwire listener answers with an ERR of its own. */
export type MysqlCode = { [C in ErrorCode]: Catalogue[C] extends { mysql: object } ? C : never }[ErrorCode];

type HttpOf<C extends HttpCode> = Catalogue[C] extends { http: infer H } ? H : never;
/** The statuses a code may be sent with: its status and its `also` list. */
export type HttpStatusOf<C extends HttpCode> =
  | (HttpOf<C> extends { status: infer S } ? S : never)
  | (HttpOf<C> extends { also: readonly (infer A)[] } ? A : never);

export const errorCodes = Object.keys(ERRORS) as ErrorCode[];

/** The HTTP status of a code (its first; `also` statuses are chosen at the call site). */
export function httpStatus<C extends HttpCode>(code: C): HttpOf<C> extends { status: infer S } ? S : never {
  return (ERRORS[code] as ErrorEntry).http!.status as never;
}

/** The SQLSTATE the pgwire listener answers a code with. */
export function pgState<C extends PgCode>(code: C): Catalogue[C] extends { pg: infer P } ? P : never {
  return (ERRORS[code] as ErrorEntry).pg as never;
}

/** The errno and SQLSTATE the mysqlwire listener answers a code with, as the ERR packet takes them. */
export function mysqlError<C extends MysqlCode>(code: C): readonly [number, string] {
  const m = (ERRORS[code] as ErrorEntry).mysql!;
  return [m.errno, m.sqlstate];
}

/** The JSON error body of the data plane, lock API, job polling and SQL over HTTP: `{ error, message }`. */
export function errorBody(code: HttpCode, message: string): { error: HttpCode; message: string } {
  return { error: code, message };
}
