// Stage 7, release: settle the slot exactly once with what the origin said (feeding the adaptive limit
// and the RPM learner), and record the request once: counters for metrics and one access-log line.
import type { Outcome, Permit, RefusalReason } from '../governor/governor.js';
import type { AdmissionSummary } from '../metrics/registry.js';
import type { AccessLog } from './access-log.js';
import type { Exchange, OutcomeName } from './exchange.js';

/** How one request ended, as the metrics need it. */
export interface RequestRecord {
  poolId: number;
  /** The pool's subdomain (the metrics label). */
  pool: string;
  status: number;
  outcome: OutcomeName;
  /** The governor's answer; null when the request was stopped before admission. */
  admission: AdmissionSummary | null;
  /** It entered the wait queue (Admission.queued). */
  waited: boolean;
  queuedMs: number;
  upstreamMs: number | null;
}

/** Where per-pool counters and histograms go; the request path only calls this. */
export interface DataplaneMetrics {
  record(r: RequestRecord): void;
  /** One policy refusal (stage 4), by pool, policy and reason. */
  policyRefused?(pool: string, policy: string, reason: string): void;
  /** A wire client pinned to its server connection for `reason` (+1), or no longer (-1). */
  wirePinned?(pool: string, protocol: 'postgres' | 'mysql', reason: string, delta: 1 | -1): void;
}

/** One finished lock API acquire on a known pool. */
export interface LockAcquireRecord {
  poolId: number;
  pool: string;
  /** The governor's answer; null when the attempt stopped before it (auth, body, policies). */
  admission: { ok: true; queuedMs: number } | { ok: false; reason: RefusalReason; queuedMs: number } | null;
  /** Whether the acquire waited for its answer (entered the queue). */
  waited: boolean;
  /** The lock API's outcome (lease_granted, or the error it answered). */
  outcome: OutcomeName;
}

export interface Settlement {
  outcome: OutcomeName;
  /** What the client got (0 when it went away first). */
  status: number;
  /** The upstream's answer for the governor, when the request was admitted. */
  upstream?: Outcome;
  /** For the access log only, never the client: why the origin failed (e.g. the address its name resolved to). */
  detail?: string;
}

export function releaseStage(metrics: DataplaneMetrics | null, accessLog: AccessLog | null) {
  return (ex: Exchange, permit: Permit | null, s: Settlement): void => {
    if (permit) permit.release(s.upstream ?? { dropped: true });
    const pool = ex.pool;
    if (pool && metrics) {
      metrics.record({
        poolId: pool.id,
        pool: pool.subdomain,
        status: s.status,
        outcome: s.outcome,
        admission: ex.admission,
        waited: ex.waited,
        queuedMs: ex.queuedMs,
        upstreamMs: ex.upstreamMs,
      });
    }
    accessLog?.write({
      pool: pool?.subdomain ?? null,
      method: ex.method,
      path: ex.path,
      status: s.status,
      outcome: s.outcome,
      queuedMs: Math.round(ex.queuedMs),
      upstreamMs: ex.upstreamMs === null ? null : Math.round(ex.upstreamMs),
      totalMs: Math.round(performance.now() - ex.startedAt),
      keyId: ex.key?.id ?? null,
      detail: s.detail,
    });
  };
}
