// Every Prometheus metric of poolgate, defined once, with per-pool handles bound to their labels.
import { Counter, Gauge, Registry, collectDefaultMetrics } from 'prom-client';
import type { PoolState, RefusalReason } from '../governor/governor.js';
import { LocalCounter, LocalHistogram, type Inc, type Observe } from './local-children.js';

/**
 * The final outcome of one pool request; each request is counted once in poolgate_pool_requests_total.
 * `admitted` is a request that got a slot and an upstream answer; `upstream_error` one that got a slot
 * but no answer (connect error, reset, timeout).
 */
export const REQUEST_OUTCOMES = [
  'admitted',
  'rejected_queue_full',
  'rejected_no_slot',
  'rejected_rate_limited',
  'queue_timeout',
  'aborted',
  'unavailable',
  'unauthorized',
  'forbidden',
  'not_found',
  'policy_denied',
  'upstream_error',
] as const;
export type RequestOutcome = (typeof REQUEST_OUTCOMES)[number];

export const REFUSAL_REASONS: readonly RefusalReason[] = ['queue_full', 'no_slot', 'queue_timeout', 'aborted', 'unavailable', 'rate_limited'];

/** The request outcome a governor refusal counts as. */
export const OUTCOME_OF_REFUSAL: Readonly<Record<RefusalReason, RequestOutcome>> = {
  queue_full: 'rejected_queue_full',
  no_slot: 'rejected_no_slot',
  queue_timeout: 'queue_timeout',
  aborted: 'aborted',
  unavailable: 'unavailable',
  rate_limited: 'rejected_rate_limited',
};

/**
 * The final outcome of one lock API acquire; each attempt on a known pool is counted once in
 * poolgate_lock_acquires_total. Governor refusals use the request outcomes' names.
 */
export const LOCK_ACQUIRE_OUTCOMES = [
  'granted',
  'rejected_queue_full',
  'rejected_no_slot',
  'rejected_rate_limited',
  'queue_timeout',
  'aborted',
  'unavailable',
  'unauthorized',
  'bad_request',
  'internal_error',
] as const;
export type LockAcquireOutcome = (typeof LOCK_ACQUIRE_OUTCOMES)[number];

export const STATUS_CLASSES = ['1xx', '2xx', '3xx', '4xx', '5xx', 'error'] as const;
export type StatusClass = (typeof STATUS_CLASSES)[number];

/** `2xx` … `5xx` for an upstream status; `error` when there was no valid answer. */
export function statusClass(status: number | undefined): StatusClass {
  if (status === undefined || !(status >= 100 && status <= 599)) return 'error';
  return STATUS_CLASSES[Math.floor(status / 100) - 1]!;
}

const MISNAMED_DEFAULT_GAUGES = ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total'];

const QUEUE_WAIT_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
const UPSTREAM_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

/** One pool's handles, made once; the request path only calls inc() and observe(). */
export interface PoolHandles {
  readonly pool: string;
  readonly requests: Readonly<Record<RequestOutcome, Inc>>;
  readonly admitted: Inc;
  readonly queued: Inc;
  readonly rejected: Readonly<Record<RefusalReason, Inc>>;
  /** Seconds an admitted request waited for its slot (0 when admitted at once). */
  readonly queueWait: Observe;
  readonly upstream: Readonly<Record<StatusClass, Observe>>;
  readonly lockAcquires: Readonly<Record<LockAcquireOutcome, Inc>>;
}

/** What the scrape-time gauges read: the governor's state of each live pool. */
export interface GaugeSource {
  pools(): Iterable<{ poolId: number; pool: string }>;
  state(poolId: number): PoolState;
}

export interface PoolMetricsOptions {
  /** Process metrics (CPU, memory, event loop lag, GC); on by default. */
  defaultMetrics?: boolean;
}

function record<K extends string, V>(keys: readonly K[], make: (k: K) => V): Record<K, V> {
  const out = {} as Record<K, V>;
  for (const k of keys) out[k] = make(k);
  return out;
}

/** The registry and every poolgate metric. One per process; `forPool` caches handles by pool label. */
export class PoolMetrics {
  readonly registry = new Registry();
  readonly #handles = new Map<string, PoolHandles>();
  #source: GaugeSource | null = null;

  // Registered first, so it runs first at each scrape: every live pool gets its handles (its outcome, admission and
  // lock series at 0) before the counters are collected, not at its first request.
  readonly #pools = new Gauge({
    name: 'poolgate_pools',
    help: 'Live pools in this node\'s configuration snapshot.',
    registers: [this.registry],
    collect: () => {
      const src = this.#source;
      let n = 0;
      if (src !== null) {
        for (const { pool } of src.pools()) {
          this.forPool(pool);
          n++;
        }
      }
      this.#pools.set(n);
    },
  });

  readonly #requests = new LocalCounter({
    name: 'poolgate_pool_requests_total',
    help: 'Pool requests by final outcome; each request is counted once.',
    labelNames: ['pool', 'outcome'] as const,
    registry: this.registry,
  });
  readonly #admitted = new LocalCounter({
    name: 'poolgate_pool_admitted_total',
    help: 'Requests granted a concurrency slot.',
    labelNames: ['pool'] as const,
    registry: this.registry,
  });
  readonly #queued = new LocalCounter({
    name: 'poolgate_pool_queued_total',
    help: 'Requests that entered the wait queue (whatever the result).',
    labelNames: ['pool'] as const,
    registry: this.registry,
  });
  readonly #rejected = new LocalCounter({
    name: 'poolgate_pool_rejected_total',
    help: 'Requests the governor refused, by reason.',
    labelNames: ['pool', 'reason'] as const,
    registry: this.registry,
  });
  readonly #queueWait = new LocalHistogram({
    name: 'poolgate_pool_queue_wait_seconds',
    help: 'Time admitted requests waited for a slot (0 when admitted at once).',
    labelNames: ['pool'] as const,
    buckets: QUEUE_WAIT_BUCKETS,
    registry: this.registry,
  });
  readonly #upstream = new LocalHistogram({
    name: 'poolgate_upstream_duration_seconds',
    help: 'Time from forwarding a request to the end of the upstream response, by status class.',
    labelNames: ['pool', 'status_class'] as const,
    buckets: UPSTREAM_BUCKETS,
    registry: this.registry,
  });

  readonly #lockAcquires = new LocalCounter({
    name: 'poolgate_lock_acquires_total',
    help: 'Lock API acquire attempts by final outcome; each attempt is counted once (slots granted or refused also count in the admitted, queued and rejected totals).',
    labelNames: ['pool', 'outcome'] as const,
    registry: this.registry,
  });

  readonly #policyRefusals = new Counter({
    name: 'poolgate_policy_refusals_total',
    help: 'Requests a pool policy (ip_allowlist, access_proxy, hmac, jwt) refused before admission, by reason.',
    labelNames: ['pool', 'policy', 'reason'] as const,
    registers: [this.registry],
  });

  readonly #wirePinned = new Gauge({
    name: 'poolgate_wire_pinned_clients',
    help: 'Wire clients pinned to their server connection now (holding its slot), by the session state that pins them; a client pinned for two reasons counts in both.',
    labelNames: ['pool', 'protocol', 'reason'] as const,
    registers: [this.registry],
  });

  readonly #wirePins = new Counter({
    name: 'poolgate_wire_pins_total',
    help: 'Times a wire client was pinned to its server connection, by the session state that pinned it.',
    labelNames: ['pool', 'protocol', 'reason'] as const,
    registers: [this.registry],
  });

  constructor(opts: PoolMetricsOptions = {}) {
    if (opts.defaultMetrics !== false) {
      collectDefaultMetrics({ register: this.registry });
      // Gauges named like counters (promtool flags them); each is the sum of its by-type twin without _total.
      for (const name of MISNAMED_DEFAULT_GAUGES) this.registry.removeSingleMetric(name);
    }
    // Gauges are read from the governor at scrape time, never written per request.
    const source = () => this.#source;
    const gauge = (name: string, help: string, read: (s: PoolState) => number) =>
      new Gauge({
        name,
        help,
        labelNames: ['pool'] as const,
        registers: [this.registry],
        collect() {
          this.reset();
          const src = source();
          if (src === null) return;
          for (const { poolId, pool } of src.pools()) this.set({ pool }, read(src.state(poolId)));
        },
      });
    gauge('poolgate_pool_in_flight', 'Slots held now.', (s) => s.inFlight);
    gauge('poolgate_pool_queue_length', 'Requests waiting for a slot now.', (s) => s.queued);
    gauge('poolgate_pool_effective_limit', 'Concurrency limit in force now: min(max_concurrent, adaptive limit).', (s) => s.effectiveLimit);
  }

  /** Where the in-flight, queue-length and effective-limit gauges read from at scrape time. */
  watch(source: GaugeSource): void {
    this.#source = source;
  }

  /** The cached handles of one pool (label: its subdomain). */
  forPool(pool: string): PoolHandles {
    let h = this.#handles.get(pool);
    if (h === undefined) {
      h = {
        pool,
        requests: record(REQUEST_OUTCOMES, (outcome) => this.#requests.child({ pool, outcome })),
        admitted: this.#admitted.child({ pool }),
        queued: this.#queued.child({ pool }),
        rejected: record(REFUSAL_REASONS, (reason) => this.#rejected.child({ pool, reason })),
        queueWait: this.#queueWait.child({ pool }),
        upstream: record(STATUS_CLASSES, (status_class) => this.#upstream.child({ pool, status_class })),
        lockAcquires: record(LOCK_ACQUIRE_OUTCOMES, (outcome) => this.#lockAcquires.child({ pool, outcome })),
      };
      this.#handles.set(pool, h);
    }
    return h;
  }

  /** Counts one policy refusal (refusals are the rare path: labels are bound here, not cached). */
  policyRefused(pool: string, policy: string, reason: string): void {
    this.#policyRefusals.inc({ pool, policy, reason });
  }

  /** A wire client pinned for `reason` (+1: counted and in the gauge) or unpinned (-1). Pins are rare: labels bound here. */
  wirePinned(pool: string, protocol: 'postgres' | 'mysql', reason: string, delta: 1 | -1): void {
    this.#wirePinned.inc({ pool, protocol, reason }, delta);
    if (delta > 0) this.#wirePins.inc({ pool, protocol, reason });
  }

  /** Drops a deleted (or renamed) pool's series and handles. */
  forget(pool: string): void {
    if (!this.#handles.delete(pool)) return;
    for (const outcome of REQUEST_OUTCOMES) this.#requests.remove({ pool, outcome });
    for (const reason of REFUSAL_REASONS) this.#rejected.remove({ pool, reason });
    for (const status_class of STATUS_CLASSES) this.#upstream.remove({ pool, status_class });
    for (const outcome of LOCK_ACQUIRE_OUTCOMES) this.#lockAcquires.remove({ pool, outcome });
    this.#admitted.remove({ pool });
    this.#queued.remove({ pool });
    this.#queueWait.remove({ pool });
  }
}

/**
 * Counts one governor answer: admitted (+ its queue wait) or refused (by reason). `waited` is whether the
 * request entered the queue (Admission.queued). A refusal is also the request's final outcome;
 * an admission's final outcome is counted when the upstream answers.
 */
/** What the metrics read of a governor answer (a worker thread sends just this). */
export type AdmissionSummary = { ok: true; queuedMs: number } | { ok: false; reason: RefusalReason; queuedMs: number };

export function recordAdmission(h: PoolHandles, a: AdmissionSummary, waited: boolean): void {
  if (waited) h.queued.inc();
  if (a.ok) {
    h.admitted.inc();
    h.queueWait.observe(a.queuedMs / 1000);
    return;
  }
  h.rejected[a.reason].inc();
  h.requests[OUTCOME_OF_REFUSAL[a.reason]].inc();
}
