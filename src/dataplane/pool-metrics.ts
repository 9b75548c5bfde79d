// The data plane's metrics sink: each finished request is counted once, in the Prometheus handles of
// its pool and in the per-minute rollups behind the Control API's metrics summary.
import type { Governor } from '../governor/governor.js';
import { recordAdmission, statusClass, type PoolMetrics, type RequestOutcome } from '../metrics/registry.js';
import type { RollupBuffer } from '../metrics/rollups.js';
import type { OutcomeName } from './exchange.js';
import type { DataplaneMetrics, RequestRecord } from './release.js';
import type { SnapshotSource } from './snapshot.js';

/** Outcomes decided before the governor; governor refusals are counted by recordAdmission. */
const EARLY: Partial<Record<OutcomeName, RequestOutcome>> = {
  not_found: 'not_found',
  unauthorized: 'unauthorized',
  forbidden: 'forbidden',
  bad_request: 'policy_denied',
  payload_too_large: 'policy_denied',
  unavailable: 'unavailable',
  client_aborted: 'aborted',
};

export class RequestMetrics implements DataplaneMetrics {
  readonly #metrics: PoolMetrics;
  readonly #rollups: RollupBuffer;

  constructor(metrics: PoolMetrics, rollups: RollupBuffer, snapshots: SnapshotSource, governor: Governor) {
    this.#metrics = metrics;
    this.#rollups = rollups;
    metrics.watch({
      *pools() {
        // Every pool the governor limits: http and database pools alike (SQL requests hold the same slots).
        for (const p of snapshots.current.pools.values()) yield { poolId: p.id, pool: p.subdomain };
      },
      state: (poolId) => governor.state(poolId),
    });
  }

  record(r: RequestRecord): void {
    const h = this.#metrics.forPool(r.pool);
    const a = r.admission;
    if (a === null) {
      // Stopped before admission (route, key, scope, bad headers): Prometheus only, not the summary.
      const o = EARLY[r.outcome];
      if (o) h.requests[o].inc();
      return;
    }
    recordAdmission(h, a, r.waited);
    this.#rollups.add(r.poolId, 'requests');
    if (r.waited) this.#rollups.add(r.poolId, 'queued');
    if (!a.ok) {
      if (a.reason !== 'aborted') this.#rollups.add(r.poolId, 'rejected');
      return;
    }
    this.#rollups.add(r.poolId, 'admitted');
    if (r.outcome === 'proxied') {
      h.requests.admitted.inc();
      if (r.upstreamMs !== null) h.upstream[statusClass(r.status)].observe(r.upstreamMs / 1000);
    } else if (r.outcome === 'client_aborted') {
      h.requests.aborted.inc();
    } else {
      h.requests.upstream_error.inc();
      if (r.upstreamMs !== null) h.upstream.error.observe(r.upstreamMs / 1000);
    }
  }
}
