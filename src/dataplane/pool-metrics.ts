// The data plane's metrics sink: each finished request is counted once, in the Prometheus handles of
// its pool and in the per-minute rollups behind the Control API's metrics summary.
import type { Governor } from '../governor/governor.js';
import { OUTCOME_OF_REFUSAL, recordAdmission, statusClass, type LockAcquireOutcome, type PoolMetrics, type RequestOutcome } from '../metrics/registry.js';
import type { RollupBuffer } from '../metrics/rollups.js';
import type { OutcomeName } from '../pool-request/exchange.js';
import type { DataplaneMetrics, LockAcquireRecord, RequestRecord } from '../pool-request/release.js';
import type { SnapshotFeed } from '../pool-request/snapshot.js';
import type { LiveCounts } from '../metrics/live-counts.js';

/** Outcomes decided before the governor; governor refusals are counted by recordAdmission. */
const EARLY: Partial<Record<OutcomeName, RequestOutcome>> = {
  not_found: 'not_found',
  unauthorized: 'unauthorized',
  forbidden: 'forbidden',
  bad_request: 'policy_denied',
  method_not_allowed: 'policy_denied',
  payload_too_large: 'policy_denied',
  unavailable: 'unavailable',
  client_aborted: 'aborted',
};

/** Lock acquires stopped before the governor, by the lock API's outcome name. */
const LOCK_EARLY: Partial<Record<OutcomeName, LockAcquireOutcome>> = {
  unauthorized: 'unauthorized',
  bad_request: 'bad_request',
  payload_too_large: 'bad_request',
  unavailable: 'unavailable',
  client_aborted: 'aborted',
  internal_error: 'internal_error',
};

export class RequestMetrics implements DataplaneMetrics {
  readonly #metrics: PoolMetrics;
  readonly #rollups: RollupBuffer;
  readonly #live: LiveCounts | null;

  constructor(metrics: PoolMetrics, rollups: RollupBuffer, snapshots: SnapshotFeed, governor: Governor, live: LiveCounts | null = null) {
    this.#metrics = metrics;
    this.#rollups = rollups;
    this.#live = live;
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
    this.#rollups.addRequest(r.poolId, a.ok, r.waited, !a.ok && a.reason !== 'aborted', {
      queueWaitMs: a.ok ? a.queuedMs : null,
      upstreamMs: a.ok ? r.upstreamMs : null,
      upstreamError: a.ok && r.outcome !== 'proxied' && r.outcome !== 'client_aborted',
    });
    this.#live?.record(r.poolId, a.ok, r.status);
    if (!a.ok) return;
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

  wirePinned(pool: string, protocol: 'postgres' | 'mysql', reason: string, delta: 1 | -1): void {
    this.#metrics.wirePinned(pool, protocol, reason, delta);
  }

  /**
   * Counts one lock acquire like a proxy request: a governor answer in the admitted / queued / rejected
   * totals and the summary rollups (a lease is a slot request), the final outcome in
   * poolgate_lock_acquires_total. Attempts stopped before the governor count in Prometheus only.
   */
  recordLockAcquire(r: LockAcquireRecord): void {
    const h = this.#metrics.forPool(r.pool);
    const a = r.admission;
    if (a === null) {
      const o = LOCK_EARLY[r.outcome];
      if (o) h.lockAcquires[o].inc();
      return;
    }
    if (r.waited) h.queued.inc();
    this.#rollups.addRequest(r.poolId, a.ok, r.waited, !a.ok && a.reason !== 'aborted', {
      queueWaitMs: a.ok ? a.queuedMs : null,
      upstreamMs: null,
      upstreamError: false,
    });
    if (!a.ok) {
      h.rejected[a.reason].inc();
      h.lockAcquires[OUTCOME_OF_REFUSAL[a.reason] as LockAcquireOutcome].inc();
      return;
    }
    h.admitted.inc();
    h.queueWait.observe(a.queuedMs / 1000);
    h.lockAcquires[r.outcome === 'lease_granted' ? 'granted' : (LOCK_EARLY[r.outcome] ?? 'internal_error')].inc();
  }
}
