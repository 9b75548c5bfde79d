// The readiness checks the roles add to the process's Health (docs/operations.md).
import type { HealthCheck } from '../health.js';
import type { RedisGovernor } from '../governor/redis.js';
import type { SnapshotFeed } from '../pool-request/snapshot.js';
import { SnapshotSource } from '../dataplane/snapshot-source.js';
import type { Sql } from '../store/sql.js';

export function storeCheck(sql: Sql): HealthCheck {
  return {
    name: 'store',
    required: true,
    run: async () => {
      await sql.query('SELECT 1');
      return { ok: true, detail: sql.engine };
    },
  };
}

export function snapshotCheck(name: string, feed: SnapshotFeed): HealthCheck {
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
export function governorCheck(governor: RedisGovernor, policy: 'closed' | 'open'): HealthCheck {
  return {
    name: 'governor',
    required: policy === 'closed',
    run: () => (governor.connected ? { ok: true, detail: 'redis' } : { ok: false, detail: `redis unreachable (governorFailurePolicy ${policy})` }),
  };
}

/** Every listener this process was asked for is bound; the detail says where. */
export function listenersCheck(ports: object): HealthCheck {
  return { name: 'listeners', required: true, run: () => ({ ok: true, detail: Object.entries(ports).map(([k, v]) => `${k} ${String(v)}`).join(', ') }) };
}
