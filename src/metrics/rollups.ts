// Per-pool per-minute traffic counts kept in memory and written to pool_metrics_minute in batches,
// never one write per request.
import { addMinuteRollups, type MinuteRollup } from '../store/metrics.js';
import type { Queryable } from '../store/sql.js';
import { bucketOf, LATENCY_BUCKETS } from '../domain/latency-buckets.js';

export type RollupField = 'requests' | 'admitted' | 'queued' | 'rejected';

const MINUTE_MS = 60_000;

interface Row {
  poolId: number;
  minuteMs: number;
  requests: number;
  admitted: number;
  queued: number;
  rejected: number;
  upstreamErrors: number;
  /** Fixed-bucket histograms (latency-buckets.ts); allocated on the minute's first observation. */
  queueWait: number[] | null;
  upstream: number[] | null;
  /** The lowest effective limit sampled for this row (null: not yet); kept when a failed flush gives the row back. */
  effectiveLimit: number | null;
}

/** A finished request's latencies for the histograms; null where it has none (refused, never forwarded). */
export interface RequestTimings {
  queueWaitMs: number | null;
  upstreamMs: number | null;
  upstreamError: boolean;
}

const newRow = (poolId: number, minuteMs: number): Row => ({
  poolId, minuteMs, requests: 0, admitted: 0, queued: 0, rejected: 0, upstreamErrors: 0, queueWait: null, upstream: null, effectiveLimit: null,
});

const observe = (hist: number[] | null, ms: number): number[] => {
  const h = hist ?? new Array<number>(LATENCY_BUCKETS).fill(0);
  h[bucketOf(ms)]!++;
  return h;
};

const addHist = (a: number[] | null, b: number[] | null): number[] | null => {
  if (a === null) return b === null ? null : [...b];
  if (b !== null) for (let i = 0; i < a.length; i++) a[i]! += b[i]!;
  return a;
};

/** Sums b's counts into a (same pool and minute). */
const mergeInto = (a: Row, b: Row): void => {
  a.requests += b.requests;
  a.admitted += b.admitted;
  a.queued += b.queued;
  a.rejected += b.rejected;
  a.upstreamErrors += b.upstreamErrors;
  a.queueWait = addHist(a.queueWait, b.queueWait);
  a.upstream = addHist(a.upstream, b.upstream);
  a.effectiveLimit = minLimit(a.effectiveLimit, b.effectiveLimit);
};

const minLimit = (a: number | null, b: number | null): number | null => (a === null ? b : b === null ? a : Math.min(a, b));

export interface RollupBufferOptions {
  db: Queryable;
  /** How often the timer flushes; 0 disables the timer (flush() and close() still write). */
  flushEveryMs?: number;
  /** Wall clock in epoch ms (minutes are wall-clock minutes); tests pass a fake one. */
  now?: () => number;
  /** Told about a timer flush that failed; its counts are kept for the next try. */
  onError?: (err: unknown) => void;
  /** Samples a pool's effective limit at flush time (the governor's); absent or null: not recorded. */
  effectiveLimit?: (poolId: number) => number | null;
}

const key = (poolId: number, minuteMs: number): string => `${poolId}:${minuteMs}`;

/**
 * Counts per pool per minute. The request path does one map read and one addition; a flush takes
 * everything counted so far and writes it with one multi-row upsert. A failed write gives its rows
 * back (merged by pool and minute, so an outage costs one row per pool per minute, not per request).
 */
export class RollupBuffer {
  readonly #db: Queryable;
  readonly #now: () => number;
  readonly #onError: (err: unknown) => void;
  readonly #effectiveLimit: (poolId: number) => number | null;
  /** The row of each pool's current minute: the hot path's only lookup. */
  #current = new Map<number, Row>();
  /** Rows of past minutes (and rows a failed flush gave back), waiting for the next flush. */
  #sealed: Row[] = [];
  #flushing: Promise<void> = Promise.resolve();
  #timer: NodeJS.Timeout | null = null;

  constructor(opts: RollupBufferOptions) {
    this.#db = opts.db;
    this.#now = opts.now ?? Date.now;
    this.#onError = opts.onError ?? (() => {});
    this.#effectiveLimit = opts.effectiveLimit ?? (() => null);
    const every = opts.flushEveryMs ?? 10_000;
    if (every > 0) {
      this.#timer = setInterval(() => this.flush().catch(this.#onError), every);
      this.#timer.unref();
    }
  }

  add(poolId: number, field: RollupField, n = 1): void {
    this.#row(poolId)[field] += n;
  }

  /** Counts one request that reached the governor: one clock read and one lookup for all its fields. */
  addRequest(poolId: number, admitted: boolean, queued: boolean, rejected: boolean, timings?: RequestTimings): void {
    const row = this.#row(poolId);
    row.requests++;
    if (admitted) row.admitted++;
    if (queued) row.queued++;
    if (rejected) row.rejected++;
    if (timings === undefined) return;
    if (timings.queueWaitMs !== null) row.queueWait = observe(row.queueWait, timings.queueWaitMs);
    if (timings.upstreamMs !== null) row.upstream = observe(row.upstream, timings.upstreamMs);
    if (timings.upstreamError) row.upstreamErrors++;
  }

  #row(poolId: number): Row {
    const t = this.#now();
    const minuteMs = t - (t % MINUTE_MS);
    let row = this.#current.get(poolId);
    if (row === undefined || row.minuteMs !== minuteMs) {
      if (row !== undefined) this.#sealed.push(row);
      row = newRow(poolId, minuteMs);
      this.#current.set(poolId, row);
    }
    return row;
  }

  /** Rows not yet written (for tests and shutdown logs). */
  get pendingRows(): number {
    return this.#sealed.length + this.#current.size;
  }

  /** Writes everything counted so far; rejects (keeping the counts) when the write fails. Flushes never overlap. */
  flush(): Promise<void> {
    const run = this.#flushing.then(() => this.#flushOnce());
    this.#flushing = run.catch(() => {});
    return run;
  }

  async #flushOnce(): Promise<void> {
    const rows = this.#sealed;
    for (const r of this.#current.values()) rows.push(r);
    this.#sealed = [];
    this.#current = new Map();
    if (rows.length === 0) return;
    for (const r of rows) r.effectiveLimit = minLimit(r.effectiveLimit, this.#effectiveLimit(r.poolId));
    const batch: MinuteRollup[] = rows.map((r) => ({
      poolId: r.poolId,
      minute: new Date(r.minuteMs),
      requests: r.requests,
      admitted: r.admitted,
      queued: r.queued,
      rejected: r.rejected,
      upstreamErrors: r.upstreamErrors,
      queueWaitHist: r.queueWait,
      upstreamHist: r.upstream,
      effectiveLimit: r.effectiveLimit,
    }));
    try {
      await addMinuteRollups(this.#db, batch);
    } catch (err) {
      this.#giveBack(rows);
      throw err;
    }
  }

  /** Puts unwritten rows back, merged by pool and minute with whatever was counted meanwhile. */
  #giveBack(rows: Row[]): void {
    const merged = new Map<string, Row>();
    for (const r of [...rows, ...this.#sealed]) {
      const k = key(r.poolId, r.minuteMs);
      const m = merged.get(k);
      if (m === undefined) merged.set(k, { ...r });
      else mergeInto(m, r);
    }
    // Current rows keep counting in place; only past rows are merged.
    for (const cur of this.#current.values()) {
      const m = merged.get(key(cur.poolId, cur.minuteMs));
      if (m === undefined) continue;
      mergeInto(cur, m);
      merged.delete(key(cur.poolId, cur.minuteMs));
    }
    this.#sealed = [...merged.values()];
  }

  /** Stops the timer and writes what is left; rejects when that last write fails. */
  async close(): Promise<void> {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
    await this.flush();
  }
}
