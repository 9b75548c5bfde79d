// The MySQL wire listener (config mysqlPort): accepts client connections, keeps every session in one
// set, shares the data plane's snapshot, governor, policies and metrics, and owns the upstream
// connections. Live counts are exposed for tests and diagnostics.
import { WireLog } from '../wire-log.js';
import { createServer, type Server, type Socket } from 'node:net';
import { readFileSync } from 'node:fs';
import { createSecureContext, type SecureContext } from 'node:tls';
import type { Governor } from '../../governor/governor.js';
import type { Logger } from '../../log.js';
import type { SnapshotFeed } from '../../pool-request/snapshot.js';
import type { DataplaneMetrics } from '../../pool-request/release.js';
import type { Policies } from '../../policies/index.js';
import { ClientSession } from './client-session.js';
import { ServerPool } from './server-pool.js';
import { ServerIdentity } from './server-identity.js';
import type { LoggedIn } from './upstream-login.js';
import { DEFAULT_DB_IDLE_TIMEOUT_MS, UpstreamPools } from '../upstream-pool.js';

export interface MysqlListenerOptions {
  host: string;
  port: number;
  snapshots: SnapshotFeed;
  governor: Governor;
  policies?: Policies | null;
  metrics?: DataplaneMetrics | null;
  log: Logger;
  /** Log one successful login in this many (config accessLogSample; 0: none); refusals and errors are always logged. */
  logSample?: number;
  clock?: () => number;
  /** Plaintext to the database when it offers no TLS (config dbAllowInsecure). */
  allowInsecure: boolean;
  /** Loopback/private database hosts allowed (config allowPrivateTargets). */
  allowPrivate: boolean;
  /** PEM files; both null: TLS is not offered to clients. */
  tlsCertFile?: string | null;
  tlsKeyFile?: string | null;
  /** Config mysqlServerVersion: 'auto' (learned from the pools' servers) or the version the greeting announces. */
  serverVersion?: string;
  /** The process's upstream pools, shared with SQL over HTTP and the PostgreSQL listener (one of its own when absent). */
  upstreamPools?: UpstreamPools;
}

export class MysqlListener {
  readonly servers: ServerPool;
  /** What the greeting announces (server-identity.ts). */
  readonly identity: ServerIdentity;
  readonly #server: Server;
  /** Every session by the connection id its greeting gave (KILL <id> names one). */
  readonly #sessions = new Map<number, ClientSession>();
  #nextId = 1;
  #port = 0;
  #closing: Promise<void> | null = null;

  private constructor(opts: MysqlListenerOptions) {
    const learned = (login: LoggedIn) => ({ version: login.serverVersion, capabilities: login.serverCapabilities, mariadbCapabilities: login.mariadbCapabilities });
    this.servers = new ServerPool({
      pools: opts.upstreamPools ?? new UpstreamPools(DEFAULT_DB_IDLE_TIMEOUT_MS),
      allowInsecure: opts.allowInsecure,
      allowPrivate: opts.allowPrivate,
      onLogin: (pool, login) => this.identity.learn(pool, learned(login)),
    });
    this.identity = new ServerIdentity({
      setting: opts.serverVersion ?? 'auto',
      snapshots: opts.snapshots,
      probe: async (pool) => learned(await this.servers.probe(pool)),
      log: opts.log,
    });
    let tls: SecureContext | null = null;
    if (opts.tlsCertFile && opts.tlsKeyFile) {
      tls = createSecureContext({ cert: readFileSync(opts.tlsCertFile), key: readFileSync(opts.tlsKeyFile) });
    }
    const deps = {
      snapshots: opts.snapshots,
      governor: opts.governor,
      servers: this.servers,
      identity: this.identity,
      policies: opts.policies ?? null,
      metrics: opts.metrics ?? null,
      clock: opts.clock ?? Date.now,
      log: opts.log,
      tls,
      wireLog: new WireLog(opts.log, 'mysqlwire', opts.logSample ?? 1),
      sessions: { byId: (id: number) => this.#sessions.get(id) },
    };
    // Accepted paused: each session's reads are taken over before anything is read (direct-reads.ts).
    this.#server = createServer({ pauseOnConnect: true }, (socket: Socket) => {
      if (this.#closing) {
        socket.destroy();
        return;
      }
      // An id still in use is skipped after a wrap: KILL must name exactly one session.
      let id = this.#nextId;
      while (this.#sessions.has(id)) id = id >= 0x7fffffff ? 1 : id + 1;
      this.#nextId = id >= 0x7fffffff ? 1 : id + 1;
      this.#sessions.set(id, new ClientSession(socket, id, deps, (s) => {
        if (this.#sessions.get(s.id) === s) this.#sessions.delete(s.id);
      }));
    });
  }

  static async start(opts: MysqlListenerOptions): Promise<MysqlListener> {
    const l = new MysqlListener(opts);
    await new Promise<void>((resolve, reject) => {
      l.#server.once('error', reject);
      l.#server.listen(opts.port, opts.host, () => resolve());
    });
    const addr = l.#server.address();
    l.#port = typeof addr === 'object' && addr ? addr.port : opts.port;
    // Learn the pools' servers now, so the first clients' greetings need not wait for it.
    l.identity.refresh();
    return l;
  }

  get port(): number {
    return this.#port;
  }

  /** Client sessions, those in a transaction, and upstream connections open (for tests and diagnostics). */
  counts(poolId?: number): { clients: number; inTransaction: number; serverConnections: number } {
    let inTransaction = 0;
    for (const s of this.#sessions.values()) if (s.pinned) inTransaction++;
    return { clients: this.#sessions.size, inTransaction, serverConnections: this.servers.openCount(poolId) };
  }

  /** Stops accepting, ends every session (transactions roll back), closes the upstream connections. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      const closed = new Promise<void>((resolve) => this.#server.close(() => resolve()));
      for (const s of [...this.#sessions.values()]) s.close();
      await closed;
      this.identity.close();
      this.servers.close();
    })();
    return this.#closing;
  }
}
