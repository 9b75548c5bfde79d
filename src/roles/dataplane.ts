// The dataplane role: pool traffic (the pool listener, in threads when dataplaneThreads is above 1), the lock
// API, the database wire listeners and the metrics server, all on one governor and one snapshot.
import type { LiveSource } from '../control/context.js';
import { PROCESS_TIME } from '../governor/clock.js';
import { MemoryGovernor } from '../governor/memory.js';
import { SharedMemoryGovernor } from '../governor/shared-memory.js';
import { storeIntake } from '../jobs/job-intake.js';
import { LockServer } from '../lock/server.js';
import { LiveCounts } from '../metrics/live-counts.js';
import { RequestMetrics } from '../dataplane/pool-metrics.js';
import { Dataplane } from '../dataplane/server.js';
import { DataplaneThreads, dataplaneThreadCount } from '../dataplane/threads/host.js';
import type { MysqlListener } from '../db/mysqlwire/listener.js';
import type { PgWireListener } from '../db/pgwire/listener.js';
import { PoolMetrics } from '../metrics/registry.js';
import { RollupBuffer } from '../metrics/rollups.js';
import { startMetricsServer, type MetricsServer } from '../metrics/server.js';
import { policiesGate } from '../policies/index.js';
import { MemoryNonceStore } from '../policies/nonce-store.js';
import { governorCheck, snapshotCheck } from './health-checks.js';
import { closes, redisSide, stopInOrder, type RoleContext, type Running } from './role.js';
import { redisTarget } from '../config/redis-target.js';
import { startMysqlListener, startPgWireListener } from './wire-listeners.js';

export interface DataplaneRole extends Running {
  /** The pool traffic listener, its governor, snapshot and database upstreams. */
  readonly dataplane: Dataplane;
  /** The per-minute pool traffic counts behind the metrics summary. */
  readonly rollups: RollupBuffer;
  /** The pool listener threads, when dataplaneThreads is above 1. */
  readonly threads: DataplaneThreads | null;
  readonly mysql: MysqlListener;
  readonly pgWire: PgWireListener;
}

/**
 * Starts the role's parts in order (governor and counts, metrics server, pool listener, lock API, MySQL,
 * PostgreSQL, threads); a failed start stops what had started. `live` gets the dashboard's live numbers.
 */
export async function startDataplaneRole(rc: RoleContext, live: { source: LiveSource | null }): Promise<DataplaneRole> {
  const { config, sql, box, log, clock, health, ports, lockApiUrl } = rc;
  const threadCount = dataplaneThreadCount(config);
  if (threadCount > 1 && redisTarget(config)) throw new Error('dataplaneThreads above 1 shares the limits in memory: it cannot be combined with redisUrl (nor redisSentinels, redisClusterNodes) yet');
  const shared = threadCount > 1 ? new SharedMemoryGovernor(PROCESS_TIME) : null;
  // With threads, one nonce store for all of them (claims come to the main thread), so a replay to another thread is caught.
  const redis = await redisSide(config, log);
  const nonces = shared ? new MemoryNonceStore() : redis?.nonces();
  const governor = redis?.governor ?? shared ?? new MemoryGovernor(rc.governorTime);
  const poolMetrics = new PoolMetrics();
  const rollups = new RollupBuffer({
    db: sql,
    onError: (err) => log.warn({ err }, 'pool metrics rollup flush failed; counts kept for the next try'),
    // Sampled at flush time (every 10 s), off the request path.
    effectiveLimit: (poolId) => governor.state(poolId).effectiveLimit,
  });
  const counts: Running = {
    stop: async () => {
      await rollups.close().catch((err: unknown) => log.warn({ err }, 'final pool metrics rollup flush failed'));
      await governor.close();
    },
  };
  let metricsServer: MetricsServer | null = null;
  let dp: Dataplane | null = null;
  let lockApi: LockServer | null = null;
  let mysql: MysqlListener | null = null;
  let pgWire: PgWireListener | null = null;
  let threads: DataplaneThreads | null = null;
  // The role's shutdown order: the listeners stop taking traffic and drain, threads first (they drain while
  // the lock API, the store and the rollups still take their work), the lock API before the pool listener
  // (freeing its leases); then the metrics server, which answered the probes (draining) meanwhile; the
  // final rollup flush and the governor last, since every listener above records into them.
  const stop = () => stopInOrder([closes(threads), closes(pgWire), closes(mysql), closes(lockApi), closes(dp), closes(metricsServer), counts]);

  try {
    metricsServer = await startMetricsServer(config.host, config.metricsPort, poolMetrics.registry, health);
    ports.metrics = metricsServer.port;
    let sink: RequestMetrics | null = null;
    const jobs = storeIntake(sql, box, log, lockApiUrl);
    dp = await Dataplane.start({
      config,
      sql,
      box,
      log,
      governor,
      metrics: { record: (r) => sink?.record(r), policyRefused: (pool, policy, reason) => poolMetrics.policyRefused(pool, policy, reason) },
      clock,
      jobs,
      lookup: rc.lookup,
      // With threads, the pool listener runs in each of them (below) and this one only holds the state.
      listen: threadCount === 1,
      nonces,
    });
    const pool = dp;
    const liveCounts = new LiveCounts();
    sink = new RequestMetrics(poolMetrics, rollups, pool.snapshots, governor, liveCounts);
    live.source = {
      state: (poolId) => governor.state(poolId),
      lastMinute: (poolId) => liveCounts.lastMinute(poolId),
      learned: (poolId) => governor.learned?.(poolId) ?? null,
    };
    health.add(snapshotCheck('snapshot', pool.snapshots));
    if (redis) health.add(governorCheck(redis.governor, config.governorFailurePolicy));
    ports.proxy = pool.port;
    // The lock API shares the data plane's snapshot, governor and access log.
    lockApi = await LockServer.start({
      host: config.host,
      port: config.lockPort,
      governor,
      // With Redis, leases live there: a slot taken on one node is renewed and released on any other.
      leases: redis?.leases(),
      metrics: sink,
      snapshots: pool.snapshots,
      log,
      accessLog: pool.accessLog,
      clock,
      jobs: { sql, log, snapshot: () => pool.snapshots.current, clock, poolDomain: config.poolDomain, lockApiUrl, policies: policiesGate(pool.policies) },
      policies: policiesGate(pool.policies),
    });
    ports.lock = lockApi.port;
    const wire = { dp: pool, governor, sink, poolMetrics };
    mysql = await startMysqlListener(rc, wire);
    pgWire = await startPgWireListener(rc, wire);
    if (shared) {
      threads = await DataplaneThreads.start({ config, log, threads: threadCount, dataplane: pool, governor: shared, metrics: sink, jobs, nonces: nonces! });
      ports.proxy = threads.port;
      ports.proxyThreads = threads.ports;
    }
    return { dataplane: pool, rollups, threads, mysql, pgWire, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
