// The PostgreSQL listener's server connections of one database pool, counted in the pool's one upstream pool
// (upstream-pool.ts: at most max_concurrent open with SQL over HTTP's, one idle timeout); idle ones kept for
// reuse (newest first), waiters served in order. A connection comes back clean or not at all: one left
// inside a transaction is rolled back (and one used by a session is DISCARDed) before anyone reuses it.
import { wireNow } from '../wire-clock.js';
import { withInsecureHint } from '../../config/hints.js';
import type { Logger } from '../../log.js';
import type { DatabaseTarget, PoolEntry, Snapshot } from '../../pool-request/snapshot.js';
import type { IdleHolder, UpstreamPool, UpstreamPools } from '../upstream-pool.js';
import { query } from './messages.js';
import { ServerConn } from './server-conn.js';
import { wantedParams } from './session-params.js';

const MAX_WANTED_MAPS = 1024;

/** How a connection is handed back: as is, rolled back first, or rolled back and reset (session mode). */
export type Reset = 'none' | 'rollback' | 'discard';

export interface ServerPoolOptions {
  target: DatabaseTarget;
  username: string;
  password: string;
  /** The database pool's upstream pool: its slots and idle timeout. */
  up: UpstreamPool;
  allowPrivate: boolean;
  allowInsecure: boolean;
  connectTimeoutMs: number;
  log: Logger;
}

const TLS_REFUSED = /does not support SSL/i;
const ROLLBACK = query('ROLLBACK');
const DISCARD = query('DISCARD ALL');

interface Waiter {
  resolve: (c: ServerConn) => void;
  reject: (e: Error) => void;
  /** Withdraws its wait for a slot of the upstream pool. */
  cancel: () => void;
}

export class ServerPool implements IdleHolder {
  readonly signature: string;
  readonly #opts: ServerPoolOptions;
  /** Idle connections, oldest first (each knows since when: ServerConn.idleSince). */
  readonly #idle: ServerConn[] = [];
  readonly #waiters: Waiter[] = [];
  /** Connections open or being opened (linked, idle, resetting). */
  #open = 0;
  #opening = 0;
  #tls = true;
  #retired = false;
  /** The ParameterStatus values of the first connection, relayed to each client at login. */
  params: ReadonlyMap<string, string> | null = null;
  /** One wanted-parameters map per distinct content (see wanted()), by its entries. */
  readonly #wantedMaps = new Map<string, ReadonlyMap<string, string>>();

  constructor(signature: string, opts: ServerPoolOptions) {
    this.signature = signature;
    this.#opts = opts;
    opts.up.join(this);
  }

  /** What a client wants on every server connection, from the parameters it set at login (session-params.ts). */
  wanted(fromClient: ReadonlyMap<string, string>): ReadonlyMap<string, string> {
    return this.shared(wantedParams(this.params ?? new Map(), fromClient));
  }

  /**
   * The one map of this content every client of the pool shares (`m` itself the first time): a server
   * connection remembers the map it was last found to match (ServerConn.settledFor), so clients wanting the
   * same values (pgbench's sixteen, each with application_name set) find it settled without comparing.
   * Bounded: past the cap the cache starts over, which costs a compare, never correctness.
   */
  shared(m: ReadonlyMap<string, string>): ReadonlyMap<string, string> {
    let key = '';
    for (const [name, value] of m) key += `${name}\0${value}\0`;
    const known = this.#wantedMaps.get(key);
    if (known) return known;
    if (this.#wantedMaps.size >= MAX_WANTED_MAPS) this.#wantedMaps.clear();
    this.#wantedMaps.set(key, m);
    return m;
  }

  get counts(): { open: number; idle: number; opening: number } {
    return { open: this.#open, idle: this.#idle.length, opening: this.#opening };
  }

  /** An idle connection at once, else a new one (under max), else the next one handed back. */
  acquire(): ServerConn | Promise<ServerConn> {
    if (this.#retired) return Promise.reject(new Error('the pool changed; reconnect'));
    while (this.#idle.length > 0) {
      const conn = this.#idle.pop()!;
      if (!conn.closed) return conn;
    }
    if (this.#opts.up.tryTake()) return this.#openOne();
    return new Promise((resolve, reject) => {
      const w: Waiter = { resolve, reject, cancel: () => {} };
      this.#waiters.push(w);
      w.cancel = this.#opts.up.want(() => {
        const i = this.#waiters.indexOf(w);
        if (i < 0 || this.#retired) return false;
        this.#waiters.splice(i, 1);
        this.#openOne().then(resolve, reject);
        return true;
      });
    });
  }

  /** Opens a connection on a slot of the upstream pool already taken. */
  async #openOne(): Promise<ServerConn> {
    this.#open++;
    this.#opening++;
    try {
      let conn: ServerConn;
      const login = this.#login();
      try {
        conn = await ServerConn.open(login);
      } catch (err) {
        const refusedTls = login.tls && TLS_REFUSED.test(String((err as Error)?.message));
        if (!(refusedTls && this.#opts.allowInsecure)) throw refusedTls ? withInsecureHint(err) : err;
        // The server has no TLS and the operator allowed plaintext (dbAllowInsecure): from now on connect without.
        if (this.#tls) this.#opts.log.warn({ host: this.#opts.target.host }, 'database refused TLS; connecting without it (dbAllowInsecure)');
        this.#tls = false;
        conn = await ServerConn.open(this.#login());
      }
      // Its slot is free once the server has ended the session.
      void conn.ended.then(() => this.#opts.up.give());
      // A copy: the connection's own map follows its later SETs.
      this.params ??= new Map(conn.params);
      conn.onClose = () => this.#forget(conn);
      if (conn.closed) this.#forget(conn);
      return conn;
    } catch (err) {
      this.#open--;
      // The slot goes to the next waiter (of this listener or another holder), who gets a try of its own.
      this.#opts.up.give();
      throw err;
    } finally {
      this.#opening--;
    }
  }

  #login() {
    const o = this.#opts;
    return { target: o.target, username: o.username, password: o.password, tls: this.#tls, allowPrivate: o.allowPrivate, connectTimeoutMs: o.connectTimeoutMs };
  }

  #forget(conn: ServerConn): void {
    const i = this.#idle.indexOf(conn);
    if (i >= 0) this.#idle.splice(i, 1);
    this.#open--;
  }

  closeIdle(): boolean {
    const oldest = this.#idle.shift();
    if (!oldest) return false;
    oldest.close();
    return true;
  }

  /**
   * Hands a connection back (unlinked by the caller), after the reset it needs. `owed`: simple queries of
   * ours still unanswered on it (a client's session-parameter setup, when the client left first): their
   * ReadyForQuery come ahead of the reset's, and counting them is what keeps the reset's own last answer
   * from reaching the next client. `now`: wireNow() when the caller has just read it (a transaction's
   * end), so the connection's idle time starts without a clock read of its own.
   */
  release(conn: ServerConn, reset: Reset, owed = 0, now?: number): void {
    if (conn.closed) return;
    conn.link = null;
    if (reset === 'none' && owed === 0 && conn.status === 'I') return this.#idleOrGive(conn, now);
    // Each reset query answers with one ReadyForQuery; any error closes the connection instead.
    const queries = reset === 'discard' ? [ROLLBACK, DISCARD] : [ROLLBACK];
    let left = queries.length + owed;
    let failed = false;
    // A reset that does not answer in time (a server in a state we did not foresee) closes the connection.
    const stuck = setTimeout(() => conn.close(), this.#opts.connectTimeoutMs);
    stuck.unref();
    conn.link = {
      onServerFrame: (type: number) => {
        if (type === 0x45 /* E */) failed = true;
        if (type !== 0x5a /* Z */ || --left > 0) return;
        clearTimeout(stuck);
        if (failed || conn.status !== 'I') return conn.close();
        if (reset === 'discard') {
          conn.prepared.clear();
          conn.resetUnreported();
        }
        conn.link = null;
        this.#idleOrGive(conn);
      },
      onServerClosed: () => clearTimeout(stuck),
    };
    conn.cork();
    for (const q of queries) conn.write(q);
    conn.uncork();
  }

  #idleOrGive(conn: ServerConn, now?: number): void {
    if (this.#retired) return conn.close();
    // shift() on an empty array is still a call into the runtime: checked first (every transaction ends here).
    const w = this.#waiters.length !== 0 ? this.#waiters.shift() : undefined;
    if (w) {
      w.cancel();
      return w.resolve(conn);
    }
    // Another holder of the upstream pool waits for a slot: this one's.
    if (this.#opts.up.waiting) return conn.close();
    conn.idleSince = now ?? wireNow();
    this.#idle.push(conn);
  }

  /**
   * Closes a connection that cannot be reused: a statement still running for a client that left. It is
   * cancelled first, since a backend busy in a statement does not notice its socket closing until it ends.
   */
  destroy(conn: ServerConn): void {
    conn.link = null;
    if (!conn.closed) conn.cancel();
    conn.close();
  }

  /** Closes idle connections unused for the upstream pool's idle timeout (`now`: wireNow()). */
  sweep(now: number): void {
    const cutoff = now - this.#opts.up.idleTimeoutMs;
    // Oldest first at the front of the list.
    while (this.#idle.length > 0 && this.#idle[0]!.idleSince < cutoff) this.#idle.shift()!.close();
  }

  /** No new acquires; idle connections close now, linked ones when handed back. */
  retire(): void {
    this.#retired = true;
    this.#opts.up.leave(this);
    for (const w of this.#waiters.splice(0)) {
      w.cancel();
      w.reject(new Error('the pool changed; reconnect'));
    }
    for (const conn of this.#idle.splice(0)) conn.close();
  }
}

/** The server pools of every database pool, by pool id; replaced when the pool's target, role or size changes. */
export class ServerPools {
  readonly #byPool = new Map<number, ServerPool>();
  readonly #base: Omit<ServerPoolOptions, 'target' | 'username' | 'password' | 'up'>;
  readonly pools: UpstreamPools;

  constructor(pools: UpstreamPools, base: Omit<ServerPoolOptions, 'target' | 'username' | 'password' | 'up'>) {
    this.pools = pools;
    this.#base = base;
  }

  static #signature(pool: PoolEntry, cred: { username: string; password: string }): string {
    return JSON.stringify([pool.database, cred.username, cred.password, pool.maxConcurrent]);
  }

  /** The pool's server pool, or why it has none (no database target, no role attached). */
  forPool(pool: PoolEntry): ServerPool | string {
    const cred = pool.credential?.method === 'postgres_role' ? pool.credential : null;
    if (!pool.database) return 'this pool has no database host';
    if (!cred) return 'this pool has no database role attached';
    const current = this.#byPool.get(pool.id);
    const signature = ServerPools.#signature(pool, cred);
    if (current?.signature === signature) return current;
    current?.retire();
    const fresh = new ServerPool(signature, {
      ...this.#base,
      target: pool.database,
      username: cred.username,
      password: cred.password,
      up: this.pools.of(pool),
    });
    this.#byPool.set(pool.id, fresh);
    return fresh;
  }

  /** After a snapshot reload: retire the server pools of pools deleted or changed. */
  sync(snapshot: Snapshot): void {
    const live = new Map<number, PoolEntry>();
    for (const p of snapshot.pools.values()) live.set(p.id, p);
    for (const [id, sp] of this.#byPool) {
      const p = live.get(id);
      const cred = p?.credential?.method === 'postgres_role' ? p.credential : null;
      if (!p || !p.database || !cred || ServerPools.#signature(p, cred) !== sp.signature) {
        this.#byPool.delete(id);
        sp.retire();
      }
    }
  }

  sweep(now: number): void {
    for (const sp of this.#byPool.values()) sp.sweep(now);
  }

  /** Open and idle server connections over every pool (a retired pool's linked connections are not counted). */
  counts(): { open: number; idle: number } {
    let open = 0;
    let idle = 0;
    for (const sp of this.#byPool.values()) {
      const c = sp.counts;
      open += c.open;
      idle += c.idle;
    }
    return { open, idle };
  }

  retireAll(): void {
    for (const sp of this.#byPool.values()) sp.retire();
    this.#byPool.clear();
  }
}
