// The data plane's database wire listeners: MySQL (src/db/mysqlwire) and PostgreSQL (src/db/pgwire). Both
// admit through the data plane's snapshot, governor and policies and report to its metrics.
import type { Dataplane } from '../dataplane/server.js';
import type { RequestMetrics } from '../dataplane/pool-metrics.js';
import type { Governor } from '../governor/governor.js';
import type { PoolMetrics } from '../metrics/registry.js';
import { MysqlListener } from '../db/mysqlwire/listener.js';
import { PgWireListener } from '../db/pgwire/listener.js';
import type { RoleContext } from './role.js';

export interface WireShared {
  readonly dp: Dataplane;
  readonly governor: Governor;
  readonly sink: RequestMetrics;
  readonly poolMetrics: PoolMetrics;
}

export async function startMysqlListener(rc: RoleContext, w: WireShared): Promise<MysqlListener> {
  const { config } = rc;
  const listener = await MysqlListener.start({
    host: config.host, port: config.mysqlPort, snapshots: w.dp.snapshots, governor: w.governor, policies: w.dp.policies, metrics: w.sink, log: rc.log,
    clock: rc.clock, allowInsecure: config.dbAllowInsecure, allowPrivate: config.allowPrivateTargets,
    tlsCertFile: config.wireTlsCertFile, tlsKeyFile: config.wireTlsKeyFile, logSample: config.accessLogSample,
    serverVersion: config.mysqlServerVersion, upstreamPools: w.dp.databases.pools,
  });
  rc.ports.mysql = listener.port;
  return listener;
}

export async function startPgWireListener(rc: RoleContext, w: WireShared): Promise<PgWireListener> {
  const { config } = rc;
  const { poolMetrics } = w;
  const listener = await PgWireListener.start({
    host: config.host, port: config.pgPort, governor: w.governor, snapshot: () => w.dp.snapshots.current, poolDomain: config.poolDomain,
    tlsCertFile: config.wireTlsCertFile, tlsKeyFile: config.wireTlsKeyFile, allowPrivate: config.allowPrivateTargets,
    allowInsecure: config.dbAllowInsecure, log: rc.log, logSample: config.accessLogSample, metrics: w.sink, clock: rc.clock,
    pins: { pinned: (pool, reason) => poolMetrics.wirePinned(pool, 'postgres', reason, 1), unpinned: (pool, reason) => poolMetrics.wirePinned(pool, 'postgres', reason, -1) },
    maxPreparedStatements: config.wireMaxPreparedStatements, policies: w.dp.policies, upstreamPools: w.dp.databases.pools,
  });
  rc.ports.pg = listener.port;
  return listener;
}
