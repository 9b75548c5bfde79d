// Connections to the upstream databases: one connection pool per database pool (pg for postgres, mysql2
// for mysql), opened with the pool's managed credential and sized to its max_concurrent, replaced when
// any of that changes. run() executes a request's statements with a deadline and cancels on timeout or
// client abort (PostgreSQL CancelRequest; MySQL KILL QUERY).
import { withInsecureHint } from '../config/hints.js';
import { isIP } from 'node:net';
import pg from 'pg';
import mysql from 'mysql2';
import type { Logger } from '../log.js';
import type { DatabaseTarget, PoolEntry, Snapshot } from '../pool-request/snapshot.js';
import { guardedConnect, guardedSocket } from './upstream-socket-guard.js';
import { mysqlFailure, pgFailure, type DbFailure } from './errors.js';
import { mysqlParam, mysqlTypeName, mysqlValue, pgTypes, type Column } from './values.js';

export interface SqlStatement {
  query: string;
  params: unknown[];
}

/** One statement's result: the command tag, affected or returned rows, columns and rows as arrays. */
export interface StatementResult {
  command: string | null;
  rowCount: number | null;
  columns: Column[];
  rows: unknown[][];
  /** MySQL: the AUTO_INCREMENT id an INSERT generated (a string: it may pass 2^53). */
  lastInsertId?: string;
}

export type RunResult =
  | { ok: true; results: StatementResult[] }
  /** `index`: the statement of a batch that failed. */
  | { ok: false; failure: DbFailure; index?: number };

export interface RunOptions {
  /** The whole request (connection, statements, commit) must end within this; then it is cancelled. */
  timeoutMs: number;
  /** Aborted when the client goes away: the running statement is cancelled. */
  signal?: AbortSignal;
  /** Run the statements in one transaction, rolled back whole on any error. */
  transaction: boolean;
}

/** One checked-out connection. */
interface Session {
  query(st: SqlStatement): Promise<StatementResult>;
  /** Fills in column type names (PostgreSQL reports type OIDs). */
  resolveTypes(results: StatementResult[]): Promise<void>;
  /** The connection is outside any transaction and can be reused. */
  idle(): boolean;
  /** Asks the server to stop the running statement. */
  cancel(): void;
  /** Cuts the connection: for a cancel that did not land. */
  destroy(): void;
  /** Back to the pool, or closed when `discard` (after a cancel, an open transaction, a broken session). */
  release(discard: boolean): void;
}

interface Upstream {
  readonly signature: string;
  readonly begin: string;
  acquire(): Promise<Session>;
  failure(err: unknown): DbFailure;
  /** Closes the pool once its checked-out sessions are back. */
  retire(): Promise<void>;
}

interface Credentials {
  username: string;
  password: string;
}

interface UpstreamOptions {
  /** Fall back to plaintext when the server refuses TLS (config dbAllowInsecure). */
  allowInsecure: boolean;
  /** Connect to loopback/private/link-local addresses (config allowPrivateTargets); otherwise refused at connect. */
  allowPrivate: boolean;
  log: Logger;
}

/** Idle upstream connections are closed after this. */
const IDLE_MS = 30_000;
/** Bounds opening one connection (TCP, TLS, authentication). */
const CONNECT_TIMEOUT_MS = 10_000;
/** After a cancel, how long the statement gets to stop before its connection is cut. */
const CANCEL_GRACE_MS = 2_000;

/** Tracks checked-out sessions so a retired pool is closed only when the last one comes back. */
abstract class Counted {
  #active = 0;
  #retired: (() => void) | null = null;
  protected checkedOut(): void {
    this.#active++;
  }
  protected checkedIn(): void {
    this.#active--;
    if (this.#active === 0 && this.#retired) this.#retired();
  }
  protected whenIdle(): Promise<void> {
    if (this.#active === 0) return Promise.resolve();
    return new Promise((resolve) => (this.#retired = resolve));
  }
}

// ---------------------------------------------------------------------------------------------- pg

const TLS_REFUSED_PG = /does not support SSL/i;

class PgUpstream extends Counted implements Upstream {
  readonly signature: string;
  readonly begin = 'BEGIN';
  readonly #target: DatabaseTarget;
  readonly #cred: Credentials;
  readonly #max: number;
  readonly #statementTimeoutMs: number;
  readonly #opts: UpstreamOptions;
  /** Type OID → name (format_type), learned once per upstream. */
  readonly typeNames = new Map<number, string>();
  #tls = true;
  #pool: pg.Pool;

  constructor(signature: string, target: DatabaseTarget, cred: Credentials, max: number, statementTimeoutMs: number, opts: UpstreamOptions) {
    super();
    this.signature = signature;
    this.#target = target;
    this.#cred = cred;
    this.#max = max;
    this.#statementTimeoutMs = statementTimeoutMs;
    this.#opts = opts;
    this.#pool = this.#makePool();
  }

  get host(): string {
    return this.#target.host;
  }
  get port(): number {
    return this.#target.port ?? 5432;
  }
  get allowPrivate(): boolean {
    return this.#opts.allowPrivate;
  }

  #makePool(): pg.Pool {
    const t = this.#target;
    const pool = new pg.Pool({
      host: t.host,
      port: this.port,
      database: t.name,
      user: this.#cred.username,
      password: this.#cred.password,
      // verify-full checks the chain and the host name; require encrypts without checking.
      // (SNI carries host names only: an IP literal is checked against the certificate's IP SANs.)
      ssl: this.#tls
        ? t.sslmode === 'verify-full'
          ? { rejectUnauthorized: true, ...(isIP(t.host) ? {} : { servername: t.host }) }
          : { rejectUnauthorized: false }
        : false,
      max: this.#max,
      idleTimeoutMillis: IDLE_MS,
      connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
      application_name: 'poolgate',
      types: pgTypes,
      // Every connection re-checks the addresses it dials (DNS may have changed since the pool was created).
      stream: () => guardedSocket(this.#opts.allowPrivate),
    } as pg.PoolConfig);
    pool.on('error', (err) => this.#opts.log.warn({ err, host: t.host }, 'idle upstream database connection failed'));
    pool.on('connect', (client) => {
      const c = client as PgClient;
      c.txStatus = 'I';
      c.connection.on('readyForQuery', (msg: { status: string }) => (c.txStatus = msg.status));
      // Queued ahead of any request's statement. UTC timestamps; the server-side statement timeout is a
      // backstop for our own cancel. SET rather than startup `options`, which poolers such as PgBouncer refuse.
      c.query(
        `SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; SET IntervalStyle = 'iso_8601'; SET statement_timeout = ${this.#statementTimeoutMs}`,
      ).catch((err: unknown) => this.#opts.log.warn({ err, host: t.host }, 'cannot set the session defaults of an upstream database connection'));
    });
    return pool;
  }

  async acquire(): Promise<Session> {
    let client: pg.PoolClient;
    const tried = this.#pool;
    try {
      client = await tried.connect();
    } catch (err) {
      if (tried === this.#pool) {
        const refusedTls = TLS_REFUSED_PG.test(String((err as Error)?.message));
        if (!(refusedTls && this.#opts.allowInsecure)) throw refusedTls ? withInsecureHint(err) : err;
        // The server has no TLS and the operator allowed plaintext (dbAllowInsecure): from now on connect without.
        this.#opts.log.warn({ host: this.#target.host }, 'database refused TLS; connecting without it (dbAllowInsecure)');
        this.#tls = false;
        this.#pool = this.#makePool();
        void tried.end().catch(() => {});
      }
      // Concurrent acquires all fail on the replaced pool: each tries once more on the current one.
      client = await this.#pool.connect();
    }
    this.checkedOut();
    return new PgSession(this, client as PgClient, () => this.checkedIn());
  }

  failure(err: unknown): DbFailure {
    return pgFailure(err);
  }

  async retire(): Promise<void> {
    await this.whenIdle();
    await this.#pool.end().catch(() => {});
  }
}

type PgClient = pg.PoolClient & {
  processID: number;
  secretKey: number | Buffer;
  txStatus: string;
  connection: { on(ev: string, f: (msg: { status: string }) => void): void; stream: { destroy(): void } };
};

class PgSession implements Session {
  readonly #up: PgUpstream;
  readonly #client: PgClient;
  readonly #done: () => void;
  #released = false;
  /** Columns whose type is still an OID. */
  readonly #pending: Array<{ column: Column; oid: number }> = [];

  constructor(up: PgUpstream, client: PgClient, done: () => void) {
    this.#up = up;
    this.#client = client;
    this.#done = done;
  }

  async query(st: SqlStatement): Promise<StatementResult> {
    // The extended protocol, even without params: one statement per query, as with parameters.
    const r = (await this.#client.query({ text: st.query, values: st.params, rowMode: 'array', queryMode: 'extended' } as pg.QueryArrayConfig)) as pg.QueryArrayResult;
    const columns: Column[] = (r.fields ?? []).map((f) => {
      const column = { name: f.name, type: this.#up.typeNames.get(f.dataTypeID) ?? '' };
      if (column.type === '') this.#pending.push({ column, oid: f.dataTypeID });
      return column;
    });
    return { command: r.command ?? null, rowCount: r.rowCount ?? null, columns, rows: r.rows ?? [] };
  }

  async resolveTypes(): Promise<void> {
    if (this.#pending.length === 0) return;
    const oids = [...new Set(this.#pending.map((p) => p.oid))];
    try {
      const r = await this.#client.query<{ oid: number; name: string }>(
        'SELECT oid::int4 AS oid, format_type(oid, NULL) AS name FROM pg_catalog.pg_type WHERE oid = ANY($1::oid[])',
        [oids],
      );
      for (const row of r.rows) this.#up.typeNames.set(row.oid, row.name);
    } catch {
      // A name is a convenience: the OID stands in when the catalog cannot be read.
    }
    for (const p of this.#pending) p.column.type = this.#up.typeNames.get(p.oid) ?? `oid:${p.oid}`;
    this.#pending.length = 0;
  }

  idle(): boolean {
    return this.#client.txStatus === 'I';
  }

  cancel(): void {
    // A CancelRequest on a new socket: needs no authentication and no free connection slot.
    const c = this.#client;
    const socket = guardedConnect(this.#up.host, this.#up.port, this.#up.allowPrivate);
    socket.setTimeout(CONNECT_TIMEOUT_MS, () => socket.destroy());
    socket.on('error', () => {});
    socket.on('connect', () => {
      const key = Buffer.isBuffer(c.secretKey) ? c.secretKey : Buffer.alloc(4);
      if (!Buffer.isBuffer(c.secretKey)) key.writeInt32BE(c.secretKey, 0);
      const msg = Buffer.alloc(12 + key.length);
      msg.writeInt32BE(msg.length, 0);
      msg.writeInt32BE(80877102, 4);
      msg.writeInt32BE(c.processID, 8);
      key.copy(msg, 12);
      socket.end(msg);
    });
  }

  destroy(): void {
    this.#client.connection.stream.destroy();
  }

  release(discard: boolean): void {
    if (this.#released) return;
    this.#released = true;
    this.#client.release(discard ? new Error('discarded') : undefined);
    this.#done();
  }
}

// ------------------------------------------------------------------------------------------- mysql

const SERVER_STATUS_IN_TRANS = 0x0001;
const SERVER_STATUS_AUTOCOMMIT = 0x0002;

class MysqlUpstream extends Counted implements Upstream {
  readonly signature: string;
  readonly begin = 'START TRANSACTION';
  readonly #target: DatabaseTarget;
  readonly #cred: Credentials;
  readonly #max: number;
  readonly #opts: UpstreamOptions;
  #tls = true;
  #pool: mysql.Pool;

  constructor(signature: string, target: DatabaseTarget, cred: Credentials, max: number, opts: UpstreamOptions) {
    super();
    this.signature = signature;
    this.#target = target;
    this.#cred = cred;
    this.#max = max;
    this.#opts = opts;
    this.#pool = this.#makePool();
  }

  connectionOptions(): mysql.ConnectionOptions {
    const t = this.#target;
    return {
      host: t.host,
      port: t.port ?? 3306,
      database: t.name,
      user: this.#cred.username,
      password: this.#cred.password,
      ssl: this.#tls ? (t.sslmode === 'verify-full' ? { rejectUnauthorized: true } : { rejectUnauthorized: false }) : undefined,
      connectTimeout: CONNECT_TIMEOUT_MS,
      // Every connection re-checks the addresses it dials (DNS may have changed since the pool was created).
      stream: () => guardedConnect(t.host, t.port ?? 3306, this.#opts.allowPrivate),
      charset: 'utf8mb4',
      // Values arrive as strings where a JS number would lose them; values.ts turns them into JSON.
      supportBigNumbers: true,
      bigNumberStrings: true,
      decimalNumbers: false,
      dateStrings: true,
      multipleStatements: false,
    };
  }

  #makePool(): mysql.Pool {
    const pool = mysql.createPool({
      ...this.connectionOptions(),
      connectionLimit: this.#max,
      maxIdle: this.#max,
      idleTimeout: IDLE_MS,
      waitForConnections: true,
      queueLimit: 0,
    });
    pool.on('connection', (conn) => {
      conn.on('error', (err) => this.#opts.log.warn({ err, host: this.#target.host }, 'upstream database connection failed'));
      // TIMESTAMP values are printed in UTC (values.ts appends the Z).
      conn.query("SET time_zone = '+00:00'");
    });
    return pool;
  }

  #connect(pool = this.#pool): Promise<mysql.PoolConnection> {
    return new Promise((resolve, reject) => pool.getConnection((err, conn) => (err ? reject(err) : resolve(conn))));
  }

  async acquire(): Promise<Session> {
    let conn: mysql.PoolConnection;
    const tried = this.#pool;
    try {
      conn = await this.#connect(tried);
    } catch (err) {
      if (tried === this.#pool) {
        const refusedTls = (err as { code?: string })?.code === 'HANDSHAKE_NO_SSL_SUPPORT';
        if (!(refusedTls && this.#opts.allowInsecure)) throw refusedTls ? withInsecureHint(err) : err;
        this.#opts.log.warn({ host: this.#target.host }, 'database refused TLS; connecting without it (dbAllowInsecure)');
        this.#tls = false;
        this.#pool = this.#makePool();
        tried.end(() => {});
      }
      // Concurrent acquires all fail on the replaced pool: each tries once more on the current one.
      conn = await this.#connect();
    }
    this.checkedOut();
    return new MysqlSession(this, conn, () => this.checkedIn());
  }

  failure(err: unknown): DbFailure {
    return mysqlFailure(err);
  }

  async retire(): Promise<void> {
    await this.whenIdle();
    await new Promise<void>((resolve) => this.#pool.end(() => resolve()));
  }
}

class MysqlSession implements Session {
  readonly #up: MysqlUpstream;
  readonly #conn: mysql.PoolConnection;
  readonly #done: () => void;
  #released = false;
  #idle = true;

  constructor(up: MysqlUpstream, conn: mysql.PoolConnection, done: () => void) {
    this.#up = up;
    this.#conn = conn;
    this.#done = done;
  }

  query(st: SqlStatement): Promise<StatementResult> {
    return new Promise((resolve, reject) => {
      this.#conn.query({ sql: st.query, values: st.params.map(mysqlParam), rowsAsArray: true }, (err, rows, fields) => {
        if (err) return reject(err);
        const command = /^\s*([A-Za-z]+)/.exec(st.query)?.[1]?.toUpperCase() ?? null;
        if (!Array.isArray(rows)) {
          // An OK packet: its status flags say whether the session is now inside a transaction.
          const h = rows as mysql.ResultSetHeader & { serverStatus?: number };
          const status = h.serverStatus ?? SERVER_STATUS_AUTOCOMMIT;
          this.#idle = (status & SERVER_STATUS_IN_TRANS) === 0 && (status & SERVER_STATUS_AUTOCOMMIT) !== 0;
          const out: StatementResult = { command, rowCount: h.affectedRows, columns: [], rows: [] };
          if (h.insertId) out.lastInsertId = String(h.insertId);
          return resolve(out);
        }
        const columns = (fields ?? []).map((f) => ({ name: f.name, type: mysqlTypeName(f) }));
        const data = (rows as unknown[][]).map((row) => row.map((v, i) => mysqlValue(columns[i]!.type, v)));
        resolve({ command, rowCount: data.length, columns, rows: data });
      });
    });
  }

  async resolveTypes(): Promise<void> {}

  idle(): boolean {
    return this.#idle;
  }

  cancel(): void {
    // KILL QUERY on a second connection as the same role (a user may kill its own statements).
    const killer = mysql.createConnection(this.#up.connectionOptions());
    killer.on('error', () => {});
    killer.query(`KILL QUERY ${Number(this.#conn.threadId)}`, () => killer.end(() => {}));
  }

  destroy(): void {
    this.#conn.destroy();
  }

  release(discard: boolean): void {
    if (this.#released) return;
    this.#released = true;
    if (discard) this.#conn.destroy();
    else this.#conn.release();
    this.#done();
  }
}

// --------------------------------------------------------------------------------------- the pools

const COMMIT = 'COMMIT';
const ROLLBACK = 'ROLLBACK';

/** The upstream connection pools of every database pool, keyed by pool id. */
export class DbUpstreams {
  readonly #opts: UpstreamOptions;
  readonly #byPool = new Map<number, Upstream>();
  /** The upstream last used for a snapshot's pool entry: the hot path skips building the signature. */
  readonly #byEntry = new WeakMap<PoolEntry, Upstream>();
  /** The stop functions of the runs under way (close() cancels them). */
  readonly #running = new Set<(why: 'aborted') => void>();
  #closed = false;

  constructor(opts: UpstreamOptions) {
    this.#opts = opts;
  }

  /** What makes a connection pool: a change in any of it replaces the pool. */
  static #signature(pool: PoolEntry, target: DatabaseTarget, cred: Credentials): string {
    return JSON.stringify([pool.backend, target, cred.username, cred.password, pool.maxConcurrent, pool.settings.requestTimeoutMs]);
  }

  #upstreamFor(pool: PoolEntry, target: DatabaseTarget, cred: Credentials): Upstream {
    const current = this.#byPool.get(pool.id);
    if (current !== undefined && this.#byEntry.get(pool) === current) return current;
    const signature = DbUpstreams.#signature(pool, target, cred);
    if (current?.signature === signature) {
      this.#byEntry.set(pool, current);
      return current;
    }
    if (current) void current.retire();
    const max = Math.max(1, pool.maxConcurrent);
    const up =
      pool.backend === 'mysql'
        ? new MysqlUpstream(signature, target, cred, max, this.#opts)
        : new PgUpstream(signature, target, cred, max, pool.settings.requestTimeoutMs, this.#opts);
    this.#byPool.set(pool.id, up);
    this.#byEntry.set(pool, up);
    return up;
  }

  /** After a snapshot reload: retire the pools of deleted pools and of pools whose host, role or size changed. */
  sync(snapshot: Snapshot): void {
    const live = new Map<number, PoolEntry>();
    for (const p of snapshot.pools.values()) live.set(p.id, p);
    for (const [id, up] of this.#byPool) {
      const p = live.get(id);
      const cred = p?.credential?.method === 'postgres_role' ? p.credential : null;
      if (!p || !p.database || !cred || DbUpstreams.#signature(p, p.database, cred) !== up.signature) {
        this.#byPool.delete(id);
        void up.retire();
      }
    }
  }

  /** Open upstream connection pools (for tests and metrics). */
  get size(): number {
    return this.#byPool.size;
  }

  /**
   * Runs the statements on one connection of the pool's upstream. Resolves, never rejects: every failure
   * is a value. The connection is cancelled and discarded on timeout or abort, and discarded whenever it
   * might still be inside a transaction.
   */
  async run(pool: PoolEntry, statements: readonly SqlStatement[], opts: RunOptions): Promise<RunResult> {
    const target = pool.database;
    if (this.#closed) return { ok: false, failure: { kind: 'unavailable', message: 'the data plane is shutting down' } };
    if (!target) return { ok: false, failure: { kind: 'unavailable', message: 'this database pool has no database host' } };
    const cred = pool.credential?.method === 'postgres_role' ? pool.credential : null;
    if (!cred) return { ok: false, failure: { kind: 'unavailable', message: 'this database pool has no database credential attached' } };
    const up = this.#upstreamFor(pool, target, cred);

    let stopReason: 'timeout' | 'aborted' | null = null;
    let session: Session | null = null;
    let grace: NodeJS.Timeout | undefined;
    let onStop!: () => void;
    const stopped = new Promise<null>((resolve) => (onStop = () => resolve(null)));
    const stop = (why: 'timeout' | 'aborted') => {
      if (stopReason) return;
      stopReason = why;
      onStop();
      if (session) {
        const s = session;
        s.cancel();
        grace = setTimeout(() => s.destroy(), CANCEL_GRACE_MS);
      }
    };
    const stoppedFailure = (): RunResult => ({
      ok: false,
      failure:
        stopReason === 'aborted'
          ? { kind: 'aborted' }
          : { kind: 'timeout', message: `the query did not finish within ${opts.timeoutMs} ms and was cancelled` },
    });
    const timer = setTimeout(() => stop('timeout'), opts.timeoutMs);
    this.#running.add(stop);
    const onAbort = () => stop('aborted');
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    if (opts.signal?.aborted) stop('aborted');
    try {
      const acquiring = up.acquire();
      const first = await Promise.race([acquiring.then((s) => ({ s }), (e: unknown) => ({ e })), stopped]);
      if (first === null || stopReason) {
        // Given up while connecting: the connection, when it comes, goes straight back.
        void acquiring.then((s) => s.release(false), () => {});
        return stoppedFailure();
      }
      if ('e' in first) {
        // Anything that fails before a session exists (refused, TLS, authentication, unknown database) is the upstream's.
        const f = up.failure(first.e);
        const message =
          f.kind === 'database' ? `the database refused the session (${f.code}): ${f.message}` : f.kind === 'aborted' ? 'cannot reach the database' : f.message;
        return { ok: false, failure: { kind: 'unreachable', message } };
      }
      session = first.s;
      const results: StatementResult[] = [];
      let index = -1;
      try {
        if (opts.transaction) await session.query({ query: up.begin, params: [] });
        for (let i = 0; i < statements.length; i++) {
          index = i;
          results.push(await session.query(statements[i]!));
        }
        index = -1;
        if (opts.transaction) await session.query({ query: COMMIT, params: [] });
        await session.resolveTypes(results);
      } catch (err) {
        if (stopReason) {
          session.release(true);
          return stoppedFailure();
        }
        const failure = up.failure(err);
        let discard = failure.kind !== 'database';
        if (opts.transaction && !discard) {
          try {
            await session.query({ query: ROLLBACK, params: [] });
          } catch {
            discard = true;
          }
        }
        session.release(discard || !session.idle());
        return { ok: false, failure, ...(opts.transaction && index >= 0 ? { index } : {}) };
      }
      if (stopReason) {
        // The answer raced the cancel: the cancel may still land, so this connection is not reused.
        session.release(true);
        return stoppedFailure();
      }
      // A lone BEGIN (or SET autocommit=0) would leak an open transaction into the next request.
      session.release(!session.idle());
      return { ok: true, results };
    } finally {
      // By now the statement has settled (a cancel that did not land was cut by the grace timer).
      clearTimeout(timer);
      clearTimeout(grace);
      this.#running.delete(stop);
      opts.signal?.removeEventListener('abort', onAbort);
    }
  }

  /** Cancels the statements still running (close comes after the data plane's drain), then closes every pool. */
  async close(): Promise<void> {
    this.#closed = true;
    for (const stop of [...this.#running]) stop('aborted');
    const ups = [...this.#byPool.values()];
    this.#byPool.clear();
    await Promise.all(ups.map((u) => u.retire()));
  }
}
