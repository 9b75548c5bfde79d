// One upstream pool per database pool per process: the one place that counts the server connections a
// database pool has open, whoever holds them (SQL over HTTP's pg/mysql2 clients, the PostgreSQL and MySQL
// listeners' raw links), keeps that count within max_concurrent, and the one idle timeout (config
// dbIdleTimeoutMs) after which an unused connection of any kind is closed. Each kind keeps its own idle list,
// since the kinds are not interchangeable (a wire link is reset before reuse, an HTTP client is a driver
// object); when the pool is full and one kind waits, another kind's idle connection is closed to make room,
// as PgBouncer does across pools under max_db_connections.
import type { PoolEntry } from '../pool-request/snapshot.js';

/** The idle timeout when no shared upstream pools are given (config dbIdleTimeoutMs's default). */
export const DEFAULT_DB_IDLE_TIMEOUT_MS = 60_000;

/** A kind of connection holder (one per listener or SQL over HTTP) of one database pool. */
export interface IdleHolder {
  /** Closes one idle connection, whose slot comes back through give() (now or when it has closed); false when none is idle. */
  closeIdle(): boolean;
}

export class UpstreamPool {
  max: number;
  readonly idleTimeoutMs: number;
  #open = 0;
  /** Slots asked for in order; each is called holding a slot and says whether it still wanted it. */
  readonly #wanting: Array<() => boolean> = [];
  readonly #holders = new Set<IdleHolder>();

  constructor(max: number, idleTimeoutMs: number) {
    this.max = max;
    this.idleTimeoutMs = idleTimeoutMs;
  }

  /** Server connections open or being opened, by every holder. */
  get open(): number {
    return this.#open;
  }

  /** Someone waits for a slot: a connection handed back should rather close than idle. */
  get waiting(): boolean {
    return this.#wanting.length > 0;
  }

  join(holder: IdleHolder): void {
    this.#holders.add(holder);
  }

  leave(holder: IdleHolder): void {
    this.#holders.delete(holder);
  }

  /** Takes a slot when the pool has one free. */
  tryTake(): boolean {
    if (this.#open >= this.max) return false;
    this.#open++;
    return true;
  }

  /**
   * Waits for a slot: `got` is called holding it and returns false when no longer wanted (the slot goes to
   * the next). Idle connections of other holders are closed to make room. Returns the cancel.
   */
  want(got: () => boolean): () => void {
    this.#wanting.push(got);
    this.#serve();
    if (this.#wanting.includes(got)) {
      for (const h of this.#holders) if (h.closeIdle()) break;
    }
    return () => {
      const i = this.#wanting.indexOf(got);
      if (i >= 0) this.#wanting.splice(i, 1);
    };
  }

  /** A connection closed (or failed to open): its slot goes to the first waiter. */
  give(): void {
    this.#open--;
    this.#serve();
  }

  /** max_concurrent changed. */
  resize(max: number): void {
    this.max = max;
    this.#serve();
  }

  #serve(): void {
    while (this.#open < this.max && this.#wanting.length > 0) {
      const got = this.#wanting.shift()!;
      this.#open++;
      if (!got()) this.#open--;
    }
  }
}

/** Every database pool's upstream pool in this process, by pool id. */
export class UpstreamPools {
  readonly idleTimeoutMs: number;
  readonly #byPool = new Map<number, UpstreamPool>();

  constructor(idleTimeoutMs: number) {
    this.idleTimeoutMs = idleTimeoutMs;
  }

  /** How often holders look for idle connections past the timeout. */
  get sweepEveryMs(): number {
    return Math.min(10_000, Math.max(100, Math.floor(this.idleTimeoutMs / 4)));
  }

  of(pool: PoolEntry): UpstreamPool {
    const max = Math.max(1, pool.maxConcurrent);
    let up = this.#byPool.get(pool.id);
    if (!up) {
      up = new UpstreamPool(max, this.idleTimeoutMs);
      this.#byPool.set(pool.id, up);
    } else if (up.max !== max) up.resize(max);
    return up;
  }

  /** Server connections open for a pool by every holder (tests, diagnostics). */
  openCount(poolId: number): number {
    return this.#byPool.get(poolId)?.open ?? 0;
  }
}
