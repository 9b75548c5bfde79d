// SQL over HTTP's connections to the upstream databases (pg clients for postgres, mysql2 for mysql), opened
// with the pool's managed credential and counted in the database pool's one upstream pool (upstream-pool.ts,
// shared with the wire listeners: max_concurrent and the idle timeout hold for all of them), replaced when
// any of that changes. run() executes a request's statements with a deadline and cancels on timeout or
// client abort (PostgreSQL CancelRequest; MySQL KILL QUERY).
import { withInsecureHint } from '../config/hints.js';
import { isIP } from 'node:net';
import pg from 'pg';
import type mysql from 'mysql2';
import { mysql2 } from './mysql2.js';
import type { Logger } from '../log.js';
import type { DatabaseTarget, PoolEntry, Snapshot } from '../pool-request/snapshot.js';
import { DEFAULT_DB_IDLE_TIMEOUT_MS, UpstreamPools, type IdleHolder, type UpstreamPool } from './upstream-pool.js';
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
  /** Closes clients idle past the idle timeout. */
  sweep(now: number): void;
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
  /** The process's upstream pools (shared with the wire listeners); one of its own when absent (jobs worker, tests). */
  pools?: UpstreamPools;
}
/** Bounds opening one connection (TCP, TLS, authentication). */
const CONNECT_TIMEOUT_MS = 10_000;
/** After a cancel, how long the statement gets to stop before its connection is cut. */
const CANCEL_GRACE_MS = 2_000;

/** How one kind of client is opened and closed. */
interface ClientKind<C> {
  /** Opens and sets up a client; `gone` is to be called once if it closes or fails on its own. */
  open(gone: (c: C) => void): Promise<C>;
  /** Ends the session; resolves once the server has closed it (or it was cut after a grace). */
  close(c: C): Promise<void>;
}

/** How long a closing client's server gets to end the session before the connection is cut. */
const CLOSE_GRACE_MS = 1_000;

/** `ending`, or after the grace `cut()` and done. */
function endWithin(ending: Promise<unknown>, cut: () => void): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      cut();
      resolve();
    }, CLOSE_GRACE_MS);
    timer.unref();
    void ending.then(
      () => (clearTimeout(timer), resolve()),
      () => (clearTimeout(timer), cut(), resolve()),
    );
  });
}

/**
 * SQL over HTTP's clients of one database pool: idle ones reused (newest first), new ones opened only with a
 * slot of the upstream pool, waiters served in order by a client handed back or a slot freed by any holder.
 */
class ClientLinks<C> implements IdleHolder {
  readonly #up: UpstreamPool;
  readonly #kind: ClientKind<C>;
  /** Open clients, each holding one slot of the upstream pool until it closes. */
  readonly #live = new Set<C>();
  readonly #idle: Array<{ c: C; since: number }> = [];
  readonly #waiters: Array<{ resolve: (c: C) => void; reject: (e: unknown) => void; cancel: () => void }> = [];
  #retired = false;

  constructor(up: UpstreamPool, kind: ClientKind<C>) {
    this.#up = up;
    this.#kind = kind;
    up.join(this);
  }

  acquire(): Promise<C> {
    if (this.#retired) return Promise.reject(new Error('the pool changed; retry'));
    const idle = this.#idle.pop();
    if (idle) return Promise.resolve(idle.c);
    if (this.#up.tryTake()) return this.#open();
    return new Promise((resolve, reject) => {
      const w = { resolve, reject, cancel: () => {} };
      this.#waiters.push(w);
      w.cancel = this.#up.want(() => {
        const i = this.#waiters.indexOf(w);
        if (i < 0) return false;
        this.#waiters.splice(i, 1);
        this.#open().then(resolve, reject);
        return true;
      });
    });
  }

  /** Opens a client on a slot already taken. */
  async #open(): Promise<C> {
    let c: C;
    try {
      c = await this.#kind.open((gone) => this.#drop(gone));
    } catch (err) {
      this.#up.give();
      throw err;
    }
    this.#live.add(c);
    return c;
  }

  /** Back from a session: to a waiter, idle, or closed (`discard`, retired, or another holder waits for a slot). */
  release(c: C, discard: boolean): void {
    if (!this.#live.has(c)) return;
    if (discard || this.#retired) return this.#drop(c);
    const w = this.#waiters.shift();
    if (w) {
      w.cancel();
      return w.resolve(c);
    }
    if (this.#up.waiting) return this.#drop(c);
    this.#idle.push({ c, since: performance.now() });
  }

  /** Closes a client and frees its slot once the server has ended the session (once, however often it is called). */
  #drop(c: C): void {
    const i = this.#idle.findIndex((e) => e.c === c);
    if (i >= 0) this.#idle.splice(i, 1);
    if (!this.#live.delete(c)) return;
    void this.#kind.close(c).then(() => this.#up.give());
  }

  closeIdle(): boolean {
    const oldest = this.#idle[0];
    if (!oldest) return false;
    this.#drop(oldest.c);
    return true;
  }

  /** Closes clients idle longer than the upstream pool's idle timeout (`now`: performance.now()). */
  sweep(now: number): void {
    const cutoff = now - this.#up.idleTimeoutMs;
    while (this.#idle.length > 0 && this.#idle[0]!.since < cutoff) this.#drop(this.#idle[0]!.c);
  }

  /** Idle clients close now, those in use when released; waiters are refused. */
  retire(): void {
    this.#retired = true;
    this.#up.leave(this);
    for (const w of this.#waiters.splice(0)) {
      w.cancel();
      w.reject(new Error('the pool changed; retry'));
    }
    while (this.#idle.length > 0) this.#drop(this.#idle[0]!.c);
  }
}

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
  readonly #statementTimeoutMs: number;
  readonly #opts: UpstreamOptions;
  /** Type OID → name (format_type), learned once per upstream. */
  readonly typeNames = new Map<number, string>();
  #tls = true;
  readonly #links: ClientLinks<PgClient>;

  constructor(signature: string, target: DatabaseTarget, cred: Credentials, up: UpstreamPool, statementTimeoutMs: number, opts: UpstreamOptions) {
    super();
    this.signature = signature;
    this.#target = target;
    this.#cred = cred;
    this.#statementTimeoutMs = statementTimeoutMs;
    this.#opts = opts;
    this.#links = new ClientLinks(up, { open: (gone) => this.#openClient(gone), close: (c) => endWithin(c.end(), () => c.connection.stream.destroy()) });
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

  #client(): PgClient {
    const t = this.#target;
    return new pg.Client({
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
      connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
      application_name: 'poolgate',
      types: pgTypes,
      // Every connection re-checks the addresses it dials (DNS may have changed since the pool was created).
      stream: () => guardedSocket(this.#opts.allowPrivate),
    } as pg.ClientConfig) as PgClient;
  }

  async #openClient(gone: (c: PgClient) => void): Promise<PgClient> {
    const t = this.#target;
    const tls = this.#tls;
    let c = this.#client();
    try {
      await c.connect();
    } catch (err) {
      void c.end().catch(() => {});
      const refusedTls = tls && TLS_REFUSED_PG.test(String((err as Error)?.message));
      if (!(refusedTls && this.#opts.allowInsecure)) throw refusedTls ? withInsecureHint(err) : err;
      // The server has no TLS and the operator allowed plaintext (dbAllowInsecure): from now on connect without.
      if (this.#tls) this.#opts.log.warn({ host: t.host }, 'database refused TLS; connecting without it (dbAllowInsecure)');
      this.#tls = false;
      c = this.#client();
      await c.connect();
    }
    const client = c;
    client.on('error', (err) => {
      this.#opts.log.warn({ err, host: t.host }, 'upstream database connection failed');
      gone(client);
    });
    client.on('end', () => gone(client));
    client.txStatus = 'I';
    client.connection.on('readyForQuery', (msg: { status: string }) => (client.txStatus = msg.status));
    // Queued ahead of any request's statement. UTC timestamps; the server-side statement timeout is a
    // backstop for our own cancel. SET rather than startup `options`, which poolers such as PgBouncer refuse.
    client
      .query(`SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; SET IntervalStyle = 'iso_8601'; SET statement_timeout = ${this.#statementTimeoutMs}`)
      .catch((err: unknown) => this.#opts.log.warn({ err, host: t.host }, 'cannot set the session defaults of an upstream database connection'));
    return client;
  }

  async acquire(): Promise<Session> {
    const client = await this.#links.acquire();
    this.checkedOut();
    return new PgSession(this, client, (discard) => {
      this.#links.release(client, discard);
      this.checkedIn();
    });
  }

  failure(err: unknown): DbFailure {
    return pgFailure(err);
  }

  sweep(now: number): void {
    this.#links.sweep(now);
  }

  async retire(): Promise<void> {
    this.#links.retire();
    await this.whenIdle();
  }
}

type PgClient = pg.Client & {
  processID: number;
  secretKey: number | Buffer;
  txStatus: string;
  connection: { on(ev: string, f: (msg: { status: string }) => void): void; stream: { destroy(): void } };
};

class PgSession implements Session {
  readonly #up: PgUpstream;
  readonly #client: PgClient;
  readonly #done: (discard: boolean) => void;
  #released = false;
  /** Columns whose type is still an OID. */
  readonly #pending: Array<{ column: Column; oid: number }> = [];

  constructor(up: PgUpstream, client: PgClient, done: (discard: boolean) => void) {
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
    this.#done(discard);
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
  readonly #opts: UpstreamOptions;
  #tls = true;
  readonly #links: ClientLinks<mysql.Connection>;

  constructor(signature: string, target: DatabaseTarget, cred: Credentials, up: UpstreamPool, opts: UpstreamOptions) {
    super();
    this.signature = signature;
    this.#target = target;
    this.#cred = cred;
    this.#opts = opts;
    this.#links = new ClientLinks(up, { open: (gone) => this.#openClient(gone), close: (c) => endWithin(new Promise<void>((resolve) => c.end(() => resolve())), () => c.destroy()) });
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

  #openConn(): Promise<mysql.Connection> {
    const conn = mysql2().createConnection(this.connectionOptions());
    return new Promise((resolve, reject) =>
      conn.connect((err) => {
        if (!err) return resolve(conn);
        conn.destroy();
        reject(err);
      }),
    );
  }

  async #openClient(gone: (c: mysql.Connection) => void): Promise<mysql.Connection> {
    let conn: mysql.Connection;
    const tls = this.#tls;
    try {
      conn = await this.#openConn();
    } catch (err) {
      const refusedTls = tls && (err as { code?: string })?.code === 'HANDSHAKE_NO_SSL_SUPPORT';
      if (!(refusedTls && this.#opts.allowInsecure)) throw refusedTls ? withInsecureHint(err) : err;
      if (this.#tls) this.#opts.log.warn({ host: this.#target.host }, 'database refused TLS; connecting without it (dbAllowInsecure)');
      this.#tls = false;
      conn = await this.#openConn();
    }
    conn.on('error', (err) => {
      this.#opts.log.warn({ err, host: this.#target.host }, 'upstream database connection failed');
      gone(conn);
    });
    conn.on('end', () => gone(conn));
    // TIMESTAMP values are printed in UTC (values.ts appends the Z).
    conn.query("SET time_zone = '+00:00'");
    return conn;
  }

  async acquire(): Promise<Session> {
    const conn = await this.#links.acquire();
    this.checkedOut();
    return new MysqlSession(this, conn, (discard) => {
      this.#links.release(conn, discard);
      this.checkedIn();
    });
  }

  failure(err: unknown): DbFailure {
    return mysqlFailure(err);
  }

  sweep(now: number): void {
    this.#links.sweep(now);
  }

  async retire(): Promise<void> {
    this.#links.retire();
    await this.whenIdle();
  }
}

class MysqlSession implements Session {
  readonly #up: MysqlUpstream;
  readonly #conn: mysql.Connection;
  readonly #done: (discard: boolean) => void;
  #released = false;
  #idle = true;

  constructor(up: MysqlUpstream, conn: mysql.Connection, done: (discard: boolean) => void) {
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
    const killer = mysql2().createConnection(this.#up.connectionOptions());
    killer.on('error', () => {});
    killer.query(`KILL QUERY ${Number(this.#conn.threadId)}`, () => killer.end(() => {}));
  }

  destroy(): void {
    this.#conn.destroy();
  }

  release(discard: boolean): void {
    if (this.#released) return;
    this.#released = true;
    this.#done(discard);
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
  readonly #pools: UpstreamPools;
  readonly #sweeper: NodeJS.Timeout;
  #closed = false;

  constructor(opts: UpstreamOptions) {
    this.#opts = opts;
    this.#pools = opts.pools ?? new UpstreamPools(DEFAULT_DB_IDLE_TIMEOUT_MS);
    this.#sweeper = setInterval(() => {
      const now = performance.now();
      for (const up of this.#byPool.values()) up.sweep(now);
    }, this.#pools.sweepEveryMs);
    this.#sweeper.unref();
  }

  /** The upstream pools these connections are counted in (shared with the wire listeners). */
  get pools(): UpstreamPools {
    return this.#pools;
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
    const shared = this.#pools.of(pool);
    const up =
      pool.backend === 'mysql'
        ? new MysqlUpstream(signature, target, cred, shared, this.#opts)
        : new PgUpstream(signature, target, cred, shared, pool.settings.requestTimeoutMs, this.#opts);
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
    clearInterval(this.#sweeper);
    for (const stop of [...this.#running]) stop('aborted');
    const ups = [...this.#byPool.values()];
    this.#byPool.clear();
    await Promise.all(ups.map((u) => u.retire()));
  }
}
