// The PostgreSQL wire listener (config pgPort): accepts client connections, owns the registry of logged-in
// clients (their BackendKeyData, for CancelRequest) and the per-pool server connections, and exposes the
// live counts tests use for leak checks.
import { WireLog } from '../wire-log.js';
import { wireNow } from '../wire-clock.js';
import { createServer, type Server, type Socket } from 'node:net';
import { randomInt } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createSecureContext, type SecureContext } from 'node:tls';
import type { Governor } from '../../governor/governor.js';
import type { Logger } from '../../log.js';
import type { RequestRecord } from '../../pool-request/release.js';
import type { Snapshot } from '../../pool-request/snapshot.js';
import type { Policies } from '../../policies/index.js';
import { ClientConn, type PinMetrics, type WireContext } from './client-conn.js';
import { ServerConn } from './server-conn.js';
import { ServerPools } from './server-pool.js';
import { DEFAULT_DB_IDLE_TIMEOUT_MS, UpstreamPools } from '../upstream-pool.js';

export interface PgWireOptions {
  host: string;
  port: number;
  governor: Governor;
  snapshot(): Snapshot;
  poolDomain: string;
  /** PEM files of the certificate offered on SSLRequest; null answers 'N' (no TLS). */
  tlsCertFile: string | null;
  tlsKeyFile: string | null;
  allowPrivate: boolean;
  allowInsecure: boolean;
  log: Logger;
  /** Log one successful login in this many (config accessLogSample; 0: none); refusals and errors are always logged. */
  logSample?: number;
  metrics?: { record(r: RequestRecord): void } | null;
  /** Pinned clients by kind of session state (poolgate_wire_pinned_clients, poolgate_wire_pins_total). */
  pins?: PinMetrics | null;
  /** The data plane's policies (IP allowlist, HTTP-only policies refused); null: none. */
  policies?: Policies | null;
  clock?: () => number;
  /** Largest client message after login (default 16 MiB). */
  maxMessageBytes?: number;
  /** Named prepared statements kept per server connection (default 200). */
  maxPreparedStatements?: number;
  loginTimeoutMs?: number;
  connectTimeoutMs?: number;
  /** The process's upstream pools, shared with SQL over HTTP and the MySQL listener (one of its own when absent). */
  upstreamPools?: UpstreamPools;
}

export const DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024;

/** What is open right now: every figure is zero on an idle listener with no clients. */
export interface WireCounts {
  /** Client connections accepted and not yet closed (logging in or logged in). */
  clients: number;
  /** Clients linked to a server connection (inside a transaction, or in session mode). */
  linked: number;
  /** Upstream server connections open in this process (linked, idle or being reset). */
  serversOpen: number;
  /** Of those, idle in their pools. */
  serversIdle: number;
}

export class PgWireListener {
  readonly #server: Server;
  readonly #clients = new Set<ClientConn>();
  readonly #byPid = new Map<number, ClientConn>();
  readonly servers: ServerPools;
  readonly #ctx: WireContext;
  readonly #sweeper: NodeJS.Timeout;
  #port = 0;
  #seen: Snapshot | null = null;

  private constructor(opts: PgWireOptions) {
    const pools = opts.upstreamPools ?? new UpstreamPools(DEFAULT_DB_IDLE_TIMEOUT_MS);
    this.servers = new ServerPools(pools, {
      allowPrivate: opts.allowPrivate,
      allowInsecure: opts.allowInsecure,
      connectTimeoutMs: opts.connectTimeoutMs ?? 10_000,
      log: opts.log,
    });
    let tls: SecureContext | null = null;
    if (opts.tlsCertFile && opts.tlsKeyFile) {
      tls = createSecureContext({ cert: readFileSync(opts.tlsCertFile), key: readFileSync(opts.tlsKeyFile) });
    }
    this.#ctx = {
      snapshot: () => {
        // A new snapshot (a reload): server pools of deleted or changed pools are retired.
        const snap = opts.snapshot();
        if (snap !== this.#seen) {
          this.#seen = snap;
          this.servers.sync(snap);
        }
        return snap;
      },
      governor: opts.governor,
      servers: this.servers,
      poolDomain: opts.poolDomain,
      tls,
      maxMessageBytes: opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES,
      maxPreparedStatements: opts.maxPreparedStatements ?? 200,
      loginTimeoutMs: opts.loginTimeoutMs ?? 30_000,
      clock: opts.clock ?? Date.now,
      metrics: opts.metrics ?? null,
      pins: opts.pins ?? null,
      policies: opts.policies ?? null,
      register: (c) => this.#register(c),
      unregister: (c) => this.#unregister(c),
      cancel: (pid, secret) => this.#cancel(pid, secret),
      log: opts.log,
      wireLog: new WireLog(opts.log, 'pgwire', opts.logSample ?? 1),
    };
    // Accepted paused: each client's reads are taken over before anything is read (direct-reads.ts).
    this.#server = createServer({ noDelay: true, pauseOnConnect: true }, (socket) => this.#accept(socket));
    this.#sweeper = setInterval(() => this.servers.sweep(wireNow()), pools.sweepEveryMs);
    this.#sweeper.unref();
  }

  static async start(opts: PgWireOptions): Promise<PgWireListener> {
    const l = new PgWireListener(opts);
    await new Promise<void>((resolve, reject) => {
      l.#server.once('error', reject);
      l.#server.listen(opts.port, opts.host, () => {
        l.#server.off('error', reject);
        resolve();
      });
    });
    const addr = l.#server.address();
    l.#port = typeof addr === 'object' && addr ? addr.port : opts.port;
    return l;
  }

  get port(): number {
    return this.#port;
  }

  counts(): WireCounts {
    let linked = 0;
    for (const c of this.#clients) if (c.linked) linked++;
    return { clients: this.#clients.size, linked, serversOpen: ServerConn.live, serversIdle: this.servers.counts().idle };
  }

  #accept(socket: Socket): void {
    socket.on('error', () => {});
    const client = new ClientConn(socket, this.#ctx);
    this.#clients.add(client);
    client.tcp.once('close', () => this.#clients.delete(client));
  }

  #register(client: ClientConn): { pid: number; secret: number } {
    let pid: number;
    do pid = randomInt(1, 0x7fffffff);
    while (this.#byPid.has(pid));
    this.#byPid.set(pid, client);
    return { pid, secret: randomInt(0, 0x7fffffff) };
  }

  #unregister(client: ClientConn): void {
    if (this.#byPid.get(client.pid) === client) this.#byPid.delete(client.pid);
  }

  /** A CancelRequest: forwarded to the server connection running that client's query, if any. */
  #cancel(pid: number, secret: number): void {
    const client = this.#byPid.get(pid);
    if (!client || client.secret !== secret) return;
    client.cancelRunning();
  }

  /** Stops accepting, tells every client the listener is going away, and closes every server connection. */
  async close(): Promise<void> {
    clearInterval(this.#sweeper);
    const closed = new Promise<void>((resolve) => this.#server.close(() => resolve()));
    for (const c of [...this.#clients]) c.terminate('poolgate is shutting down');
    this.servers.retireAll();
    await closed;
  }
}
