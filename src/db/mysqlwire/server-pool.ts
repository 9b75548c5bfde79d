// Each database pool's upstream connections for the MySQL listener: idle ones kept per client variant,
// counted in the pool's one upstream pool (upstream-pool.ts: at most max_concurrent open with SQL over HTTP's,
// one idle timeout), opened as the pool's role on demand, closed when idle too long, when the pool's target
// or role changes, or when they come back unclean.
import { mysql2 } from '../mysql2.js';
import type { PoolEntry } from '../../pool-request/snapshot.js';
import { COM, frame } from './packets.js';
import { ServerConn } from './server-conn.js';
import { upstreamLogin, type LoggedIn, type LoginTarget } from './upstream-login.js';
import type { IdleHolder, UpstreamPool, UpstreamPools } from '../upstream-pool.js';

const CONNECT_TIMEOUT_MS = 10_000;
/** After KILL QUERY, how long the statement gets to stop before its connection is cut. */
const KILL_GRACE_MS = 2_000;

let collationMap: Map<number, [string, string]> | null = null;
/**
 * Collation id → [charset, collation] names, for SET NAMES when a connection changes hands; built from mysql2's
 * table at first use (mysql2 is loaded only when a MySQL client needs it).
 */
function collations(): Map<number, [string, string]> {
  if (collationMap) return collationMap;
  collationMap = new Map();
  for (const [name, id] of Object.entries((mysql2() as unknown as { Charsets: Record<string, number> }).Charsets)) {
    const lower = name.toLowerCase();
    if (typeof id === 'number' && !collationMap.has(id)) collationMap.set(id, [lower.split('_')[0]!, lower]);
  }
  return collationMap;
}

export interface PoolOptions {
  /** The process's upstream pools, shared with SQL over HTTP and the PostgreSQL listener. */
  pools: UpstreamPools;
  allowInsecure: boolean;
  allowPrivate: boolean;
  /** Every upstream login that succeeded (server-identity.ts learns the server's greeting from it). */
  onLogin?: (pool: PoolEntry, login: LoggedIn) => void;
}

class PoolConns implements IdleHolder {
  signature = '';
  readonly up: UpstreamPool;
  readonly idle: ServerConn[] = [];
  /** Every open connection, idle or in use (closed together when the listener closes). */
  readonly all = new Set<ServerConn>();
  open = 0;
  readonly waiters: Array<() => void> = [];

  constructor(up: UpstreamPool) {
    this.up = up;
    up.join(this);
  }

  wakeOne(): void {
    this.waiters.shift()?.();
  }

  closeIdle(): boolean {
    const oldest = this.idle.shift();
    if (!oldest) return false;
    oldest.destroy();
    return true;
  }

  /**
   * Waits for a connection handed back (false: look again) or a slot of the upstream pool, freed by any of
   * its holders (true: the caller holds it).
   */
  wait(): Promise<boolean> {
    return new Promise((resolve) => {
      let done = false;
      const wake = () => {
        if (done) return;
        done = true;
        cancel();
        resolve(false);
      };
      this.waiters.push(wake);
      const cancel = this.up.want(() => {
        if (done) return false;
        done = true;
        const i = this.waiters.indexOf(wake);
        if (i >= 0) this.waiters.splice(i, 1);
        resolve(true);
        return true;
      });
    });
  }
}

/** Signatures by pool entry: a snapshot's entries do not change (a new snapshot brings new ones). */
const signatures = new WeakMap<PoolEntry, string | null>();

/** What a pool's server connections were opened for (target and role); null without a database role. Once per entry, not per transaction. */
export function poolSignature(pool: PoolEntry): string | null {
  let s = signatures.get(pool);
  if (s === undefined) {
    s = signatureOf(pool);
    signatures.set(pool, s);
  }
  return s;
}

function signatureOf(pool: PoolEntry): string | null {
  const cred = pool.credential?.method === 'postgres_role' ? pool.credential : null;
  const db = pool.database;
  if (!cred || !db) return null;
  return JSON.stringify([db.host, db.port, db.name, db.sslmode, cred.username, cred.password]);
}

export class ServerPool {
  readonly #opts: PoolOptions;
  readonly #byPool = new Map<number, PoolConns>();
  readonly #timer: NodeJS.Timeout;
  #closed = false;

  constructor(opts: PoolOptions) {
    this.#opts = opts;
    this.#timer = setInterval(() => this.#sweep(), opts.pools.sweepEveryMs);
    this.#timer.unref();
  }

  /**
   * An idle connection that fits as it is (same variant and collation), taken at once with no promise; null
   * when checkout() must convert, open or wait for one. The caller holds a governor slot.
   */
  takeIdle(pool: PoolEntry, signature: string, variant: number, collation: number): ServerConn | null {
    const pc = this.#byPool.get(pool.id);
    if (!pc || pc.signature !== signature || this.#closed) return null;
    this.#opts.pools.of(pool);
    const idle = pc.idle;
    for (let j = idle.length - 1; j >= 0; j--) {
      const c = idle[j]!;
      if (c.variant !== variant || c.collation !== collation) continue;
      if (j === idle.length - 1) idle.pop();
      else idle.splice(j, 1);
      return c;
    }
    return null;
  }

  /** A connection for one command or transaction of `pool`; the caller holds a governor slot. */
  async checkout(pool: PoolEntry, signature: string, variant: number, collation: number): Promise<ServerConn> {
    let pc = this.#byPool.get(pool.id);
    if (!pc) {
      pc = new PoolConns(this.#opts.pools.of(pool));
      this.#byPool.set(pool.id, pc);
    } else this.#opts.pools.of(pool);
    if (pc.signature !== signature) {
      pc.signature = signature;
      for (const c of pc.idle.splice(0)) c.destroy();
    }
    for (;;) {
      if (this.#closed) throw new Error('the MySQL listener is closing');
      let i = -1;
      for (let j = pc.idle.length - 1; j >= 0; j--) {
        const c = pc.idle[j]!;
        if (c.variant !== variant) continue;
        i = j;
        if (c.collation === collation) break;
      }
      if (i >= 0) {
        const c = pc.idle.splice(i, 1)[0]!;
        if (c.collation !== collation) await this.#setNames(c, collation);
        return c;
      }
      if (pc.up.tryTake()) return this.#open(pool, pc, variant, collation);
      if (pc.idle.length > 0) {
        // Full of connections opened for another variant: swap one.
        pc.idle.shift()!.destroy();
        continue;
      }
      if (await pc.wait()) return this.#open(pool, pc, variant, collation);
    }
  }

  #target(pool: PoolEntry, variant: number, collation: number): LoginTarget {
    const cred = pool.credential as { username: string; password: string };
    const db = pool.database!;
    return {
      host: db.host,
      port: db.port ?? 3306,
      database: db.name,
      user: cred.username,
      password: cred.password,
      sslmode: db.sslmode,
      allowInsecure: this.#opts.allowInsecure,
      allowPrivate: this.#opts.allowPrivate,
      variant,
      collation: collations().has(collation) && collation < 256 ? collation : 45,
      timeoutMs: CONNECT_TIMEOUT_MS,
    };
  }

  /** Opens a connection on a slot of the upstream pool already taken. */
  async #open(pool: PoolEntry, pc: PoolConns, variant: number, collation: number): Promise<ServerConn> {
    const target = this.#target(pool, variant, collation);
    const signature = pc.signature;
    pc.open++;
    let conn: ServerConn;
    try {
      const login = await upstreamLogin(target);
      this.#opts.onLogin?.(pool, login);
      conn = new ServerConn(login, variant, target.collation, signature);
    } catch (err) {
      pc.open--;
      pc.up.give();
      pc.wakeOne();
      throw err;
    }
    pc.all.add(conn);
    // Its slot is free once the server has ended the session.
    void conn.ended.then(() => pc.up.give());
    conn.onGone(() => {
      pc.all.delete(conn);
      pc.open--;
      const at = pc.idle.indexOf(conn);
      if (at >= 0) pc.idle.splice(at, 1);
      pc.wakeOne();
    });
    if (target.collation !== collation) await this.#setNames(conn, collation);
    return conn;
  }

  async #setNames(conn: ServerConn, collation: number): Promise<void> {
    const names = collations().get(collation);
    if (!names) return;
    const a = await conn.run(frame(0, Buffer.from(`\x03SET NAMES ${names[0]} COLLATE ${names[1]}`, 'latin1')), 'single', null);
    if (!a.error) conn.collation = collation;
  }

  /** Back from a client: kept when clean and still wanted (after a reset if it may carry session state), else closed. */
  checkin(pool: PoolEntry | undefined, conn: ServerConn, reusable: boolean): void {
    if (!conn.alive) return;
    const pc = pool ? this.#byPool.get(pool.id) : undefined;
    if (!pool || !pc || !reusable || conn.busy || conn.doomed || conn.signature !== pc.signature || pc.up.open > pc.up.max || this.#closed) {
      conn.destroy();
      return;
    }
    if (conn.dirty || !conn.clean) {
      void this.#scrub(pool, pc, conn);
      return;
    }
    this.#idle(pc, conn);
  }

  #idle(pc: PoolConns, conn: ServerConn): void {
    // Another holder of the upstream pool waits for a slot (and none of ours for a connection): this one's.
    if (pc.waiters.length === 0 && pc.up.waiting) {
      conn.destroy();
      return;
    }
    conn.idleSince = Date.now();
    pc.idle.push(conn);
    pc.wakeOne();
  }

  /**
   * COM_RESET_CONNECTION (rolls back, drops variables, temporary tables, locks and prepared statements),
   * then COM_INIT_DB of the pool's database; a connection that fails either is closed.
   */
  async #scrub(pool: PoolEntry, pc: PoolConns, conn: ServerConn): Promise<void> {
    try {
      const reset = await conn.run(frame(0, Buffer.from([COM.RESET_CONNECTION])), 'single', null);
      conn.statements.clear();
      conn.collation = conn.initialCollation;
      const db = Buffer.concat([Buffer.from([COM.INIT_DB]), Buffer.from(pool.database?.name ?? '', 'utf8')]);
      const use = reset.error ? reset : await conn.run(frame(0, db), 'single', null);
      if (reset.error || use.error || !conn.clean || this.#closed) {
        conn.destroy();
        return;
      }
      conn.dirty = false;
      this.#idle(pc, conn);
    } catch {
      conn.destroy();
    }
  }

  /** A connection whose client left inside a transaction: rolled back and reset, then checked in. */
  reset(pool: PoolEntry | undefined, conn: ServerConn): void {
    conn.dirty = true;
    this.checkin(pool, conn, true);
  }

  /**
   * Stops the statement running on `conn` (its deadline passed): `KILL QUERY` from a separate session of
   * the same role, outside the pool's count; if that fails or the statement has not stopped within the
   * grace, the connection is cut (unless `cutAfterGrace` is false: a client's own KILL QUERY, or a connection
   * cut already). The client then gets the server's ERR (or ERR 1317 naming the lost connection).
   */
  async killQuery(pool: PoolEntry, conn: ServerConn, cutAfterGrace = true): Promise<void> {
    const command = conn.commands;
    if (!conn.busy) return;
    conn.doomed = true;
    const cut = () => {
      if (conn.busy && conn.commands === command) conn.destroy();
    };
    if (cutAfterGrace) setTimeout(cut, KILL_GRACE_MS).unref();
    let killer: ServerConn | null = null;
    try {
      killer = new ServerConn(await upstreamLogin(this.#target(pool, 0, 45)), 0, 45, '');
      const a = await killer.run(frame(0, Buffer.from(`\x03KILL QUERY ${conn.threadId}`, 'latin1')), 'single', null);
      if (a.error) cut();
    } catch {
      cut();
    } finally {
      killer?.destroy();
    }
  }

  /** Logs in to `pool`'s server as its role and leaves (COM_QUIT): what the server announces, outside the pool's count. */
  async probe(pool: PoolEntry): Promise<LoggedIn> {
    const login = await upstreamLogin(this.#target(pool, 0, 45));
    const s = login.socket;
    s.on('error', () => s.destroy());
    s.resume();
    s.end(frame(0, Buffer.from([COM.QUIT])));
    setTimeout(() => s.destroy(), 1_000).unref();
    return login;
  }

  /** Upstream connections open (idle and in use), per pool or in all. */
  openCount(poolId?: number): number {
    if (poolId !== undefined) return this.#byPool.get(poolId)?.open ?? 0;
    let n = 0;
    for (const pc of this.#byPool.values()) n += pc.open;
    return n;
  }

  idleCount(poolId: number): number {
    return this.#byPool.get(poolId)?.idle.length ?? 0;
  }

  #sweep(): void {
    for (const pc of this.#byPool.values()) {
      const cutoff = Date.now() - pc.up.idleTimeoutMs;
      for (const c of pc.idle.filter((c) => c.idleSince < cutoff)) c.destroy();
    }
  }

  close(): void {
    this.#closed = true;
    clearInterval(this.#timer);
    for (const pc of this.#byPool.values()) {
      for (const c of [...pc.all]) c.destroy();
      for (const w of pc.waiters.splice(0)) w();
    }
  }
}
