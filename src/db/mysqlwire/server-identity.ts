// What poolgate's greeting announces (config mysqlServerVersion): the server version and the MariaDB
// capabilities it can pass through. The greeting goes out before the client names its pool, so with
// 'auto' they are learned from the upstream servers of the snapshot's MySQL pools: each server
// connection's login teaches its server's, and a server no connection has reached yet is probed (a login
// as the pool's role, then COM_QUIT). Pools on servers of different engines announce the neutral fallback.
// Capabilities that change what a server sends (session tracking, MariaDB's extended metadata) are offered
// only when every learned server offers them.
import type { Logger } from '../../log.js';
import type { PoolEntry, Snapshot, SnapshotFeed } from '../../pool-request/snapshot.js';
import { LEARNED_CAPABILITIES, PASSABLE_MARIADB_CAPABILITIES } from './packets.js';
import { poolSignature } from './server-pool.js';

/** Announced when nothing is learned yet, when pools' servers are of different engines, or on a MySQL-only poolgate without pools. */
export const FALLBACK_VERSION = '8.0.36-poolgate';
/** With nothing learned and a probe under way, a greeting waits at most this for it. */
export const GREETING_WAIT_MS = 2_000;
/** A server whose probe failed is probed again at most this often. */
const PROBE_RETRY_MS = 30_000;
/** Probes running at once (each is one short upstream login). */
const PROBE_CONCURRENCY = 4;

export interface Greeting {
  version: string;
  /** Classic capabilities among LEARNED_CAPABILITIES offered (those every server offers). */
  capabilities: number;
  /** MariaDB extended capabilities offered (only those poolgate passes through). */
  mariadbCapabilities: number;
}

/** What one upstream server said in its greeting. */
export interface Learned {
  version: string;
  capabilities: number;
  mariadbCapabilities: number;
}

export interface ServerIdentityOptions {
  /** 'auto', or the version string to announce. */
  setting: string;
  snapshots: SnapshotFeed;
  /** Logs in to the pool's server once and reports its greeting. */
  probe: (pool: PoolEntry) => Promise<Learned>;
  log: Logger;
  clock?: () => number;
}

/** The server a pool's connections go to: one identity per host and port. */
export function serverKey(pool: PoolEntry): string | null {
  const db = pool.database;
  return db ? `${db.host}:${db.port ?? 3306}` : null;
}

const isMariadb = (version: string) => /mariadb/i.test(version);

/** Numeric version ("5.5.5-10.11.6-MariaDB" → [10, 11, 6]: MariaDB's replication prefix dropped). */
function versionNumbers(version: string): number[] {
  const m = /^(?:5\.5\.5-)?(\d+)\.(\d+)\.(\d+)/.exec(version);
  return m ? [Number(m[1]), Number(m[2]), Number(m[3])] : [0, 0, 0];
}

function older(a: string, b: string): boolean {
  const x = versionNumbers(a);
  const y = versionNumbers(b);
  for (let i = 0; i < 3; i++) if (x[i] !== y[i]) return x[i]! < y[i]!;
  return a < b;
}

export class ServerIdentity {
  readonly #opts: ServerIdentityOptions;
  readonly #clock: () => number;
  /** Server key → what it announced, for the servers of the snapshot's MySQL pools. */
  readonly #learned = new Map<string, Learned>();
  /** Server key → a pool on it (to probe it with), as of the last snapshot seen. */
  #servers = new Map<string, PoolEntry>();
  #seen: Snapshot | null = null;
  /** Server key → when its last probe failed. */
  readonly #failedAt = new Map<string, number>();
  readonly #probing = new Set<string>();
  #queue: string[] = [];
  /** Greetings waiting for a first answer. */
  #waiting: Array<() => void> = [];
  /** When greetings stop waiting for the probes under way; null: none has waited since they started. */
  #waitDeadline: number | null = null;
  #announced: Greeting | null = null;
  #mixedWarned = false;
  #closed = false;

  constructor(opts: ServerIdentityOptions) {
    this.#opts = opts;
    this.#clock = opts.clock ?? Date.now;
  }

  /**
   * The greeting to send now; a promise only while nothing is learned and a probe runs. All greetings that
   * wait share one deadline, GREETING_WAIT_MS after the first of them: past it none waits until the probes
   * under way have ended (a server that never answers costs one wait, not one per client).
   */
  greeting(): Greeting | Promise<Greeting> {
    this.#follow();
    if (this.#learned.size > 0 || this.#probing.size === 0) return this.#current();
    const now = this.#clock();
    this.#waitDeadline ??= now + GREETING_WAIT_MS;
    const ms = this.#waitDeadline - now;
    if (ms <= 0) return this.#current();
    return new Promise<Greeting>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        resolve(this.#current());
      };
      const timer = setTimeout(() => {
        this.#waiting = this.#waiting.filter((w) => w !== done);
        resolve(this.#current());
      }, ms);
      this.#waiting.push(done);
    });
  }

  /** A login to `pool`'s server succeeded (a server connection or a probe): remember what it announced. */
  learn(pool: PoolEntry, seen: Learned): void {
    const key = serverKey(pool);
    if (!key) return;
    const before = this.#learned.get(key);
    this.#failedAt.delete(key);
    if (before && before.version === seen.version && before.capabilities === seen.capabilities && before.mariadbCapabilities === seen.mariadbCapabilities) return;
    this.#learned.set(key, { version: seen.version, capabilities: seen.capabilities, mariadbCapabilities: seen.mariadbCapabilities });
    this.#announced = null;
    this.#wake();
  }

  /** Looks at the snapshot's MySQL pools (again when it changed) and probes servers not learned yet. */
  refresh(): void {
    this.#follow();
  }

  close(): void {
    this.#closed = true;
    this.#queue = [];
    this.#wake();
  }

  #follow(): void {
    const snap = this.#opts.snapshots.current;
    if (snap === this.#seen || this.#closed) {
      // O(1) on the accept path while every server is learned or being probed.
      if (this.#learned.size + this.#probing.size < this.#servers.size) this.#probeMissing();
      return;
    }
    this.#seen = snap;
    const servers = new Map<string, PoolEntry>();
    for (const pool of snap.pools.values()) {
      if (pool.backend !== 'mysql' || pool.status !== 'active' || poolSignature(pool) === null) continue;
      const key = serverKey(pool);
      if (key && !servers.has(key)) servers.set(key, pool);
    }
    this.#servers = servers;
    // Servers no pool points at any more no longer count.
    for (const key of [...this.#learned.keys()]) {
      if (!servers.has(key)) {
        this.#learned.delete(key);
        this.#announced = null;
      }
    }
    this.#probeMissing();
  }

  #probeMissing(): void {
    if (this.#closed) return;
    const now = this.#clock();
    for (const key of this.#servers.keys()) {
      if (this.#learned.has(key) || this.#probing.has(key) || this.#queue.includes(key)) continue;
      const failed = this.#failedAt.get(key);
      if (failed !== undefined && now - failed < PROBE_RETRY_MS) continue;
      this.#queue.push(key);
    }
    while (this.#probing.size < PROBE_CONCURRENCY && this.#queue.length > 0) {
      const key = this.#queue.shift()!;
      const pool = this.#servers.get(key);
      if (!pool) continue;
      this.#probing.add(key);
      this.#opts.probe(pool).then(
        (seen) => {
          this.#probing.delete(key);
          if (!this.#closed && this.#servers.has(key)) this.learn(pool, seen);
          this.#wake();
          this.#probeMissing();
        },
        (err: unknown) => {
          this.#probing.delete(key);
          this.#failedAt.set(key, this.#clock());
          this.#opts.log.warn({ err: (err as Error).message, server: key }, 'mysql listener: could not learn the server version of a pool\'s database');
          if (this.#probing.size === 0) this.#wake();
          this.#probeMissing();
        },
      );
    }
  }

  #wake(): void {
    if (this.#probing.size === 0) this.#waitDeadline = null;
    for (const w of this.#waiting.splice(0)) w();
  }

  #current(): Greeting {
    this.#announced ??= this.#compute();
    return this.#announced;
  }

  #compute(): Greeting {
    const setting = this.#opts.setting;
    const seen = [...this.#learned.values()];
    const fixed = setting === 'auto' ? null : setting;
    if (seen.length === 0) return { version: fixed ?? FALLBACK_VERSION, capabilities: 0, mariadbCapabilities: 0 };
    let capabilities = LEARNED_CAPABILITIES;
    for (const s of seen) capabilities &= s.capabilities;
    const mariadb = seen.filter((s) => isMariadb(s.version)).length;
    if (mariadb !== 0 && mariadb !== seen.length) {
      // Either engine's version would mislead the other's clients (e.g. mysql2 then asks MySQL for nothing
      // it lacks, but keys MariaDB quirks on the version); the fallback is what poolgate always announced.
      if (!this.#mixedWarned) {
        this.#mixedWarned = true;
        this.#opts.log.warn({ servers: [...this.#learned.entries()].map(([k, s]) => `${k} ${s.version}`) }, 'mysql listener: MySQL pools point at servers of different engines; the greeting announces the fallback version (set mysqlServerVersion to choose one)');
      }
      return { version: fixed ?? FALLBACK_VERSION, capabilities, mariadbCapabilities: 0 };
    }
    // Same engine: the oldest version, so a client that gates features on it uses none some server lacks,
    // and only the MariaDB capabilities every server offers.
    let version = seen[0]!.version;
    let caps = PASSABLE_MARIADB_CAPABILITIES;
    for (const s of seen) {
      if (older(s.version, version)) version = s.version;
      caps &= s.mariadbCapabilities;
    }
    return { version: fixed ?? version, capabilities, mariadbCapabilities: caps };
  }
}
