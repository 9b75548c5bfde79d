// Starts the roles of one process (control, dataplane, worker) on one store, and stops them in order.
import { resolve } from 'node:path';
import type { Config } from './config/schema.js';
import { buildControlApp, type ControlApp } from './control/app.js';
import type { ControlContext } from './control/context.js';
import { loadMasterKey, SecretBox } from './security/secret-box.js';
import { ownHosts, systemLookup, type Lookup } from './security/targets.js';
import { openStore } from './store/open.js';
import type { Sql } from './store/sql.js';
import { acquireDataDirLock, type DataDirLock } from './store/data-dir-lock.js';
import { startAdminSocket, type AdminSocket } from './admin/socket.js';
import { loadUws } from './http/uws.js';
import { createLogger, type LogFormat, type Logger } from './log.js';
import { Dataplane } from './dataplane/server.js';
import { LockServer } from './lock/server.js';
import { MysqlListener } from './db/mysqlwire/listener.js';
import { PgWireListener } from './db/pgwire/listener.js';
import { policiesGate } from './policies/index.js';
import { RequestMetrics } from './dataplane/pool-metrics.js';
import { MemoryGovernor } from './governor/memory.js';
import { RedisGovernor, redisGovernorFromConfig } from './governor/redis.js';
import { RedisLeaseRegistry } from './lock/redis-leases.js';
import { PoolMetrics } from './metrics/registry.js';
import { RollupBuffer } from './metrics/rollups.js';
import { startMetricsServer } from './metrics/server.js';
import { Upstreams, forwardBuffered } from './dataplane/forward.js';
import { type SnapshotFeed } from './pool-request/snapshot.js';
import { SnapshotSource, poolLimits } from './dataplane/snapshot-source.js';
import { DataplaneThreads, dataplaneThreadCount } from './dataplane/threads/host.js';
import { SharedMemoryGovernor } from './governor/shared-memory.js';
import { PROCESS_TIME, SYSTEM_TIME } from './governor/clock.js';
import { storeIntake } from './jobs/intake.js';
import { MemoryNonceStore } from './policies/nonce-store.js';
import type { Governor } from './governor/governor.js';
import { JobRunner, type JobRunnerTuning } from './jobs/runner.js';
import { DbUpstreams } from './db/upstream.js';
import { enqueueJobEvent } from './webhooks/outbox.js';
import { Deliverer } from './webhooks/deliverer.js';
import { closeEnvelopeWorkers } from './webhooks/envelope-body.js';
import { Health, type HealthCheck } from './health.js';
import { Registry } from 'prom-client';
import { LiveCounts } from './metrics/live-counts.js';
import type { LiveSource } from './control/context.js';

export type RoleName = 'control' | 'dataplane' | 'worker';

export interface ServiceOptions {
  config: Config;
  roles: readonly RoleName[];
  /** DNS resolution used by the target guard; tests pass one that maps names to fixed addresses. */
  lookup?: Lookup;
  now?: () => Date;
  log?: Logger;
  /** The job runner's limits (result cap, retry backoff, jitter source); tests make them small. */
  jobs?: JobRunnerTuning;
}

export interface Ports {
  control?: number;
  proxy?: number;
  lock?: number;
  metrics?: number;
  pg?: number;
  mysql?: number;
  /** Each pool listener thread's port, when dataplaneThreads is above 1 (all equal to proxy when shared). */
  proxyThreads?: number[];
}

export interface Service {
  readonly config: Config;
  readonly sql: Sql;
  readonly box: SecretBox;
  readonly log: Logger;
  readonly now: () => Date;
  readonly ports: Ports;
  readonly control: ControlApp | null;
  /** The pool traffic listener (and its governor), when this process runs the dataplane role. */
  readonly dataplane: Dataplane | null;
  /** The per-minute pool traffic counts behind the metrics summary (flush() writes them now). */
  readonly rollups: RollupBuffer | null;
  /** The async job runner, when this process runs the worker role. */
  readonly jobs: JobRunner | null;
  /** The pool listener threads, when dataplaneThreads is above 1. */
  readonly dataplaneThreads: DataplaneThreads | null;
  /** The MySQL wire listener, when this process runs the dataplane role. */
  readonly mysql: MysqlListener | null;
  /** The PostgreSQL wire listener, when this process runs the dataplane role. */
  readonly pgWire: PgWireListener | null;
  /** Liveness and readiness of this process (served at /livez, /readyz, /healthz). */
  readonly health: Health;
  close(): Promise<void>;
}


export async function startService(opts: ServiceOptions): Promise<Service> {
  const { config } = opts;
  if (opts.roles.length < 3 && !config.databaseUrl) {
    throw new Error('running roles in separate processes needs a shared store: set DATABASE_URL (PostgreSQL)');
  }
  // Refuse early, before anything binds, when the native uWS build is missing.
  if (opts.roles.includes('dataplane')) loadUws();

  const lock: DataDirLock | null = config.databaseUrl ? null : acquireDataDirLock(resolve(config.dataDir));
  let sql: Sql;
  try {
    sql = await openStore(config);
  } catch (err) {
    lock?.release();
    throw err;
  }
  const box = new SecretBox(loadMasterKey(config.secretKey, config.dataDir));
  const now = opts.now ?? (() => new Date());
  // Unix ms for the data plane's per-request checks (key expiry): Date.now itself unless a test fixes the time,
  // so no Date object is made per request.
  const nowOverride = opts.now;
  const clock: () => number = nowOverride ? () => nowOverride().getTime() : Date.now;
  const log = opts.log ?? createLogger(config.logLevel, config.logFormat as LogFormat);
  const closers: Array<() => Promise<void>> = [];
  const ports: Ports = {};
  let control: ControlApp | null = null;
  let dataplane: Dataplane | null = null;
  let rollupBuffer: RollupBuffer | null = null;
  let jobRunner: JobRunner | null = null;
  let threadsHost: DataplaneThreads | null = null;
  let pgWireListener: PgWireListener | null = null;
  let admin: AdminSocket | null = null;
  let mysqlListener: MysqlListener | null = null;
  // Where jobs are polled: the lock API's public address (its port is known once it listens).
  const health = new Health(opts.roles);
  health.add(storeCheck(sql));
  const lockApiUrl = () => config.lockApiUrl ?? `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${ports.lock ?? config.lockPort}`;

  // The dashboard's live numbers: filled in by the data plane role when it shares this process.
  const live: { source: LiveSource | null } = { source: null };

  try {
    if (opts.roles.includes('control')) {
      const base = config.baseUrl ?? '';
      const lockApi = config.lockApiUrl ?? '';
      const urls = { base, lockApi, dashboard: config.dashboardUrl ?? `${base}/dashboard` };
      const own = ownHosts(config, [base, lockApi]);
      const ctx: ControlContext = {
        config,
        sql,
        box,
        now,
        log,
        urls,
        live,
        targets: { allowPrivate: config.allowPrivateTargets, ownHosts: own, lookup: opts.lookup ?? systemLookup },
        health,
      };
      control = await buildControlApp(ctx);
      await control.listen({ host: config.host, port: config.controlPort });
      const addr = control.server.address();
      ports.control = typeof addr === 'object' && addr ? addr.port : config.controlPort;
      // Public addresses default to what we bound, once the port is known.
      const hostForUrl = config.host.includes(':') ? `[${config.host}]` : config.host;
      if (!config.baseUrl) urls.base = `http://${hostForUrl}:${ports.control}`;
      if (!config.dashboardUrl) urls.dashboard = `${urls.base}/dashboard`;
      if (!config.lockApiUrl) urls.lockApi = `http://${hostForUrl}:${config.lockPort}`;
      own.splice(0, own.length, ...ownHosts(config, [urls.base, urls.lockApi]));
      const app = control;
      closers.push(() => app.close());
    }
    if (!config.databaseUrl) {
      // The embedded store is held by this process; admin commands reach it through this socket.
      admin = await startAdminSocket(resolve(config.dataDir), { config, sql, box, now });
      const a = admin;
      closers.push(() => a.close());
    }
    if (opts.roles.includes('worker')) {
      // Webhook deliverer: sends the outbox; stopped after the other roles so in-flight sends finish.
      const deliverer = new Deliverer({
        sql,
        box,
        log,
        targets: {
          allowPrivate: config.allowPrivateTargets,
          ownHosts: ownHosts(config, [config.baseUrl ?? '', config.lockApiUrl ?? '']),
          lookup: opts.lookup ?? systemLookup,
        },
        caFile: config.webhookCaFile,
        retry: { baseMs: config.webhookRetryBaseMs, capMs: config.webhookRetryCapMs, maxAttempts: config.webhookMaxAttempts },
        leaseMs: config.webhookClaimLeaseMs,
        concurrency: config.webhookConcurrency,
        perDestination: Math.min(config.webhookDestinationConcurrency, config.webhookConcurrency),
        pollMs: Math.min(1000, config.webhookRetryBaseMs),
        retentionMs: config.webhookReplayRetentionHours * 3600 * 1000,
      });
      await deliverer.start();
      closers.push(async () => {
        await deliverer.stop();
        await closeEnvelopeWorkers();
      });
    }
    if (opts.roles.includes('dataplane')) {
      const threads = dataplaneThreadCount(config);
      if (threads > 1 && config.redisUrl) throw new Error('dataplaneThreads above 1 shares the limits in memory: it cannot be combined with redisUrl yet');
      const shared = threads > 1 ? new SharedMemoryGovernor(PROCESS_TIME) : null;
      // With threads, one nonce store for all of them (claims come to the main thread), so a replay to another thread is caught.
      const nonces = shared ? new MemoryNonceStore() : undefined;
      const governor = config.redisUrl ? await redisGovernorFromConfig(config, log, SYSTEM_TIME) : (shared ?? new MemoryGovernor(SYSTEM_TIME));
      const poolMetrics = new PoolMetrics();
      const rollups = new RollupBuffer({
        db: sql,
        onError: (err) => log.warn({ err }, 'pool metrics rollup flush failed; counts kept for the next try'),
        // Sampled at flush time (every 10 s), off the request path.
        effectiveLimit: (poolId) => governor.state(poolId).effectiveLimit,
      });
      rollupBuffer = rollups;
      closers.push(async () => {
        await rollups.close().catch((err: unknown) => log.warn({ err }, 'final pool metrics rollup flush failed'));
        await governor.close();
      });
      const metricsServer = await startMetricsServer(config.host, config.metricsPort, poolMetrics.registry, health);
      ports.metrics = metricsServer.port;
      closers.push(() => metricsServer.close());
      let sink: RequestMetrics | null = null;
      const jobs = storeIntake(sql, box, log, lockApiUrl);
      const dp = await Dataplane.start({
        config,
        sql,
        box,
        log,
        governor,
        metrics: { record: (r) => sink?.record(r), policyRefused: (pool, policy, reason) => poolMetrics.policyRefused(pool, policy, reason) },
        clock,
        jobs,
        lookup: opts.lookup,
        // With threads, the pool listener runs in each of them (below) and this one only holds the state.
        listen: threads === 1,
        nonces,
      });
      const liveCounts = new LiveCounts();
      sink = new RequestMetrics(poolMetrics, rollups, dp.snapshots, governor, liveCounts);
      live.source = { state: (poolId) => governor.state(poolId), lastMinute: (poolId) => liveCounts.lastMinute(poolId) };
      health.add(snapshotCheck('snapshot', dp.snapshots));
      if (governor instanceof RedisGovernor) health.add(governorCheck(governor, config.governorFailurePolicy));
      ports.proxy = dp.port;
      dataplane = dp;
      // Closed first on shutdown: stop taking pool traffic and let in-flight requests finish.
      closers.push(() => dp.close());
      // The lock API shares the data plane's snapshot, governor and access log; it closes first (freeing its leases).
      const lockApi = await LockServer.start({
        host: config.host,
        port: config.lockPort,
        governor,
        // With Redis, leases live there: a slot taken on one node is renewed and released on any other.
        leases: governor instanceof RedisGovernor ? new RedisLeaseRegistry(governor) : undefined,
        metrics: sink,
        snapshots: dp.snapshots,
        log,
        accessLog: dp.accessLog,
        clock,
        jobs: { sql, log, snapshot: () => dp.snapshots.current, clock, poolDomain: config.poolDomain, lockApiUrl, policies: policiesGate(dp.policies) },
        policies: policiesGate(dp.policies),
      });
      ports.lock = lockApi.port;
      closers.push(() => lockApi.close());
      // The MySQL wire listener shares the same snapshot, governor, policies and metrics (src/db/mysqlwire).
      const mysqlWire = await MysqlListener.start({
        host: config.host, port: config.mysqlPort, snapshots: dp.snapshots, governor, policies: dp.policies, metrics: sink, log,
        clock, allowInsecure: config.dbAllowInsecure, allowPrivate: config.allowPrivateTargets,
        tlsCertFile: config.wireTlsCertFile, tlsKeyFile: config.wireTlsKeyFile, logSample: config.accessLogSample,
      });
      ports.mysql = mysqlWire.port;
      mysqlListener = mysqlWire;
      closers.push(() => mysqlWire.close());
      // The PostgreSQL wire listener shares the snapshot and governor; it closes before the data plane.
      const pgWire = await PgWireListener.start({
        host: config.host, port: config.pgPort, governor, snapshot: () => dp.snapshots.current, poolDomain: config.poolDomain,
        tlsCertFile: config.wireTlsCertFile, tlsKeyFile: config.wireTlsKeyFile, allowPrivate: config.allowPrivateTargets,
        allowInsecure: config.dbAllowInsecure, log, logSample: config.accessLogSample, metrics: sink, clock,
        pins: { pinned: (pool, reason) => poolMetrics.wirePinned(pool, 'postgres', reason, 1), unpinned: (pool, reason) => poolMetrics.wirePinned(pool, 'postgres', reason, -1) },
        maxPreparedStatements: config.wireMaxPreparedStatements, policies: dp.policies,
      });
      ports.pg = pgWire.port;
      pgWireListener = pgWire;
      closers.push(() => pgWire.close());
      if (shared) {
        const host = await DataplaneThreads.start({ config, log, threads, dataplane: dp, governor: shared, metrics: sink, jobs, nonces: nonces! });
        ports.proxy = host.port;
        ports.proxyThreads = host.ports;
        threadsHost = host;
        // Closed first: the threads drain while the lock API, the store and the rollups still take their work.
        closers.push(() => host.close());
      }
    }
    if (opts.roles.includes('worker')) {
      // The job runner takes slots from the data plane's governor when it shares the process, and
      // otherwise follows the config itself through the configured governor (Redis shares the limits).
      let governor: Governor;
      let snapshots: SnapshotFeed;
      let databases: DbUpstreams;
      if (dataplane) {
        governor = dataplane.governor;
        snapshots = dataplane.snapshots;
        databases = dataplane.databases;
      } else {
        const own = config.redisUrl ? await redisGovernorFromConfig(config, log, SYSTEM_TIME) : new MemoryGovernor(SYSTEM_TIME);
        // Database pools' jobs need connections of their own when no data plane shares the process.
        const ownDatabases = new DbUpstreams({ allowInsecure: config.dbAllowInsecure, allowPrivate: config.allowPrivateTargets, log });
        const source = new SnapshotSource({
          sql, box, log, clock, resyncMs: config.snapshotResyncMs,
          onLoad: (snap) => {
            own.configure(poolLimits(snap), snap.budgets);
            ownDatabases.sync(snap);
          },
        });
        await source.start();
        health.add(snapshotCheck('worker_snapshot', source));
        if (own instanceof RedisGovernor) health.add(governorCheck(own, config.governorFailurePolicy));
        closers.push(async () => {
          await source.close();
          await ownDatabases.close();
          await own.close();
        });
        governor = own;
        snapshots = source;
        databases = ownDatabases;
      }
      const upstreams = new Upstreams({
        caFile: config.originCaFile,
        targets: { allowPrivate: config.allowPrivateTargets, lookup: opts.lookup ?? systemLookup },
        trustedProxies: config.trustedProxies.split(',').map((c) => c.trim()).filter(Boolean),
      });
      const runner = new JobRunner({
        sql, box, governor, snapshot: () => snapshots.current, forward: (pool, req, cap) => forwardBuffered(upstreams, pool, req, cap), databases, enqueue: enqueueJobEvent, log,
        poolDomain: config.poolDomain, lockApiUrl, exclusiveStore: !config.databaseUrl, ...opts.jobs,
      });
      await runner.start();
      // Closed before the data plane: running jobs finish while their slots are still honoured.
      closers.push(async () => {
        await runner.close();
        await upstreams.close();
      });
      jobRunner = runner;
    }
    if (ports.metrics === undefined) {
      // Roles without pool traffic still answer the health paths (and an empty /metrics) on the metrics port,
      // so every process of a split deployment has the same probe address.
      const metricsServer = await startMetricsServer(config.host, config.metricsPort, new Registry(), health);
      ports.metrics = metricsServer.port;
      closers.push(() => metricsServer.close());
    }
    health.add({ name: 'listeners', required: true, run: () => ({ ok: true, detail: Object.entries(ports).map(([k, v]) => `${k} ${String(v)}`).join(', ') }) });
    health.serving();
  } catch (err) {
    for (const c of closers.reverse()) await c().catch(() => {});
    await sql.close().catch(() => {});
    lock?.release();
    throw err;
  }

  let closing: Promise<void> | null = null;
  return {
    config,
    sql,
    box,
    log,
    now,
    ports,
    control,
    dataplane,
    rollups: rollupBuffer,
    jobs: jobRunner,
    dataplaneThreads: threadsHost,
    mysql: mysqlListener,
    pgWire: pgWireListener,
    health,
    close() {
      health.draining();
      closing ??= (async () => {
        // Stop accepting first, let in-flight work finish, then close the store.
        for (const c of closers.reverse()) await c().catch(() => {});
        await sql.close().catch(() => {});
        lock?.release();
      })();
      return closing;
    },
  };
}

function storeCheck(sql: Sql): HealthCheck {
  return {
    name: 'store',
    required: true,
    run: async () => {
      await sql.query('SELECT 1');
      return { ok: true, detail: sql.engine };
    },
  };
}

function snapshotCheck(name: string, feed: SnapshotFeed): HealthCheck {
  return {
    name,
    required: true,
    run: () => {
      const source = feed instanceof SnapshotSource ? feed : null;
      if (!source) return { ok: true };
      if (source.fullLoads === 0) return { ok: false, detail: 'no snapshot loaded yet' };
      const age = Math.round((Date.now() - source.loadedAt) / 1000);
      return source.lastLoadError === null
        ? { ok: true, detail: `loaded ${age} s ago` }
        // Still serving from the previous snapshot; the store check says whether the store is the cause.
        : { ok: true, detail: `serving the snapshot of ${age} s ago; the last reload failed: ${source.lastLoadError}` };
    },
  };
}

/**
 * With the 'closed' failure policy a node without Redis refuses every pool request, so it is not ready; with
 * 'open' it admits against its local share and stays ready (the check is reported, not required).
 */
function governorCheck(governor: RedisGovernor, policy: 'closed' | 'open'): HealthCheck {
  return {
    name: 'governor',
    required: policy === 'closed',
    run: () => (governor.connected ? { ok: true, detail: 'redis' } : { ok: false, detail: `redis unreachable (governorFailurePolicy ${policy})` }),
  };
}
