// The worker role's job runner: claims async jobs and sends them upstream within the pools' limits.
import { DbUpstreams } from '../db/upstream.js';
import { runSqlRequest } from '../db/sql-over-http.js';
import { Upstreams, forwardBuffered } from '../dataplane/forward.js';
import type { Dataplane } from '../dataplane/server.js';
import type { SnapshotFeed } from '../pool-request/snapshot.js';
import { SnapshotSource, poolLimits } from '../dataplane/snapshot-source.js';
import type { Governor } from '../governor/governor.js';
import { MemoryGovernor } from '../governor/memory.js';
import { JobRunner, type JobRunnerTuning } from '../jobs/runner.js';
import { enqueueJobEvent } from '../webhooks/outbox.js';
import { governorCheck, snapshotCheck } from './health-checks.js';
import { redisSide, type RoleContext, type Running } from './role.js';
import { UpstreamPools } from '../db/upstream-pool.js';

export interface JobRunnerRole extends Running {
  readonly runner: JobRunner;
}

/** What the runner admits through: the data plane's, or a governor and snapshot of its own. */
interface Admission {
  governor: Governor;
  snapshots: SnapshotFeed;
  databases: DbUpstreams;
  /** Ends what was made for the runner alone (nothing when it borrowed the data plane's). */
  stop(): Promise<void>;
}

/**
 * Starts the runner. It takes slots from the data plane's governor when `dataplane` shares the process, and
 * otherwise follows the config itself through the configured governor (Redis shares the limits).
 */
export async function startJobRunner(rc: RoleContext, dataplane: Dataplane | null, tuning?: JobRunnerTuning): Promise<JobRunnerRole> {
  const { config, sql, box, log } = rc;
  const admission = dataplane
    ? { governor: dataplane.governor, snapshots: dataplane.snapshots, databases: dataplane.databases, stop: async () => {} }
    : await ownAdmission(rc);
  const upstreams = new Upstreams({
    caFile: config.originCaFile,
    targets: { allowPrivate: config.allowPrivateTargets, lookup: rc.lookup },
    trustedProxies: config.trustedProxies.split(',').map((c) => c.trim()).filter(Boolean),
  });
  const { governor, snapshots, databases } = admission;
  const runner = new JobRunner({
    sql, box, governor, snapshot: () => snapshots.current, forward: (pool, req, cap) => forwardBuffered(upstreams, pool, req, cap),
    runSql: (pool, body) => runSqlRequest(databases, pool, body), enqueue: enqueueJobEvent, log,
    poolDomain: config.poolDomain, lockApiUrl: rc.lockApiUrl, exclusiveStore: !config.databaseUrl, ...tuning,
  });
  try {
    await runner.start();
  } catch (err) {
    await upstreams.close().catch(() => {});
    await admission.stop().catch(() => {});
    throw err;
  }
  return {
    runner,
    // Running jobs finish first, while their slots are still honoured; then what they admitted through.
    stop: async () => {
      await runner.close().catch(() => {});
      await upstreams.close().catch(() => {});
      await admission.stop().catch(() => {});
    },
  };
}

/** A worker-only process: its own snapshot, governor and database connections, followed from the store. */
async function ownAdmission(rc: RoleContext): Promise<Admission> {
  const { config, sql, box, log, clock, health } = rc;
  const redis = await redisSide(config, log);
  const own = redis?.governor ?? new MemoryGovernor(rc.governorTime);
  // Database pools' jobs need connections of their own when no data plane shares the process.
  const databases = new DbUpstreams({ allowInsecure: config.dbAllowInsecure, allowPrivate: config.allowPrivateTargets, log, pools: new UpstreamPools(config.dbIdleTimeoutMs) });
  const source = new SnapshotSource({
    sql, box, log, clock, resyncMs: config.snapshotResyncMs,
    onLoad: (snap) => {
      own.configure(poolLimits(snap), snap.budgets);
      databases.sync(snap);
    },
  });
  const stop = async () => {
    await source.close();
    await databases.close();
    await own.close();
  };
  try {
    await source.start();
  } catch (err) {
    await stop().catch(() => {});
    throw err;
  }
  health.add(snapshotCheck('worker_snapshot', source));
  if (redis) health.add(governorCheck(redis.governor, config.governorFailurePolicy));
  return { governor: own, snapshots: source, databases, stop };
}
