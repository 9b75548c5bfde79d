// Per-pool per-minute traffic rollups (pool_metrics_minute): the data plane's batch writer, retention
// pruning, and the sums the metrics summary reads.
import { LATENCY_BUCKETS, quantileMs } from '../domain/latency-buckets.js';
import type { Queryable } from './sql.js';

/** Counts one pool saw in one minute; added to whatever the row already holds. */
export interface MinuteRollup {
  poolId: number;
  /** Any instant in the minute; truncated to the minute in SQL. */
  minute: Date;
  requests: number;
  admitted: number;
  queued: number;
  rejected: number;
  /** Admitted requests whose upstream failed (5xx answered by poolgate, connection errors). */
  upstreamErrors?: number;
  /** Fixed-bucket histograms (src/domain/latency-buckets.ts), added element-wise; null: none observed. */
  queueWaitHist?: readonly number[] | null;
  upstreamHist?: readonly number[] | null;
  /** An effective limit sampled in the minute; the row keeps the lowest. */
  effectiveLimit?: number | null;
}

export interface RollupTotals {
  requests: number;
  admitted: number;
  queued: number;
  rejected: number;
}

const isCount = (n: number): boolean => Number.isSafeInteger(n) && n >= 0;

/**
 * Adds many rollup increments in one statement. Increments for the same pool and minute within the
 * batch are summed first (ON CONFLICT may touch a row only once per statement); rows of pools that no
 * longer exist are skipped so one deleted pool cannot fail the whole batch.
 */
export async function addMinuteRollups(db: Queryable, rows: readonly MinuteRollup[]): Promise<void> {
  if (rows.length === 0) return;
  const isHist = (h: readonly number[] | null | undefined): boolean => h == null || (h.length === LATENCY_BUCKETS && h.every(isCount));
  for (const r of rows) {
    if (
      !isCount(r.poolId) || Number.isNaN(r.minute.getTime()) || ![r.requests, r.admitted, r.queued, r.rejected, r.upstreamErrors ?? 0].every(isCount) ||
      !isHist(r.queueWaitHist) || !isHist(r.upstreamHist) || (r.effectiveLimit != null && !isCount(r.effectiveLimit))
    ) {
      throw new TypeError(`invalid metrics rollup: ${JSON.stringify(r)}`);
    }
  }
  // Same pool and minute summed here first (ON CONFLICT may touch a row only once per statement).
  const merged = new Map<string, Required<MinuteRollup>>();
  for (const r of rows) {
    const minute = new Date(r.minute.getTime() - (r.minute.getTime() % 60_000));
    const k = `${r.poolId}:${minute.getTime()}`;
    const m = merged.get(k);
    const qw = r.queueWaitHist ?? null;
    const up = r.upstreamHist ?? null;
    if (m === undefined) {
      merged.set(k, {
        poolId: r.poolId, minute, requests: r.requests, admitted: r.admitted, queued: r.queued, rejected: r.rejected,
        upstreamErrors: r.upstreamErrors ?? 0, queueWaitHist: qw && [...qw], upstreamHist: up && [...up], effectiveLimit: r.effectiveLimit ?? null,
      });
      continue;
    }
    m.requests += r.requests;
    m.admitted += r.admitted;
    m.queued += r.queued;
    m.rejected += r.rejected;
    m.upstreamErrors += r.upstreamErrors ?? 0;
    m.queueWaitHist = sumHist(m.queueWaitHist as number[] | null, qw);
    m.upstreamHist = sumHist(m.upstreamHist as number[] | null, up);
    if (r.effectiveLimit != null) m.effectiveLimit = m.effectiveLimit === null ? r.effectiveLimit : Math.min(m.effectiveLimit, r.effectiveLimit);
  }
  const batch = [...merged.values()];
  const histText = (h: readonly number[] | null): string | null => (h === null ? null : `{${h.join(',')}}`);
  await db.query(
    `INSERT INTO pool_metrics_minute AS m
            (pool_id, minute, requests, admitted, queued, rejected, upstream_errors, queue_wait_hist, upstream_hist, effective_limit_min)
     SELECT u.pool_id, u.minute, u.requests, u.admitted, u.queued, u.rejected, u.upstream_errors,
            u.queue_wait_hist::int8[], u.upstream_hist::int8[], u.effective_limit
       FROM unnest($1::int4[], $2::timestamptz[], $3::int8[], $4::int8[], $5::int8[], $6::int8[], $7::int8[], $8::text[], $9::text[], $10::int4[])
            AS u (pool_id, minute, requests, admitted, queued, rejected, upstream_errors, queue_wait_hist, upstream_hist, effective_limit)
      WHERE EXISTS (SELECT 1 FROM pools p WHERE p.id = u.pool_id)
     ON CONFLICT (pool_id, minute) DO UPDATE SET
       requests = m.requests + EXCLUDED.requests,
       admitted = m.admitted + EXCLUDED.admitted,
       queued   = m.queued + EXCLUDED.queued,
       rejected = m.rejected + EXCLUDED.rejected,
       upstream_errors = m.upstream_errors + EXCLUDED.upstream_errors,
       queue_wait_hist = ${HIST_SUM('queue_wait_hist')},
       upstream_hist = ${HIST_SUM('upstream_hist')},
       effective_limit_min = LEAST(m.effective_limit_min, EXCLUDED.effective_limit_min)`,
    [
      batch.map((r) => r.poolId),
      batch.map((r) => r.minute.toISOString()),
      batch.map((r) => r.requests),
      batch.map((r) => r.admitted),
      batch.map((r) => r.queued),
      batch.map((r) => r.rejected),
      batch.map((r) => r.upstreamErrors),
      batch.map((r) => histText(r.queueWaitHist)),
      batch.map((r) => histText(r.upstreamHist)),
      batch.map((r) => r.effectiveLimit),
    ],
  );
}

/** Element-wise sum of the stored and the incoming histogram (either may be null). */
const HIST_SUM = (col: string): string =>
  `CASE WHEN m.${col} IS NULL THEN EXCLUDED.${col} WHEN EXCLUDED.${col} IS NULL THEN m.${col}
        ELSE ARRAY(SELECT a + b FROM unnest(m.${col}, EXCLUDED.${col}) WITH ORDINALITY AS t(a, b, i) ORDER BY i) END`;

const sumHist = (a: number[] | null, b: readonly number[] | null): number[] | null => {
  if (a === null) return b === null ? null : [...b];
  if (b !== null) for (let i = 0; i < a.length; i++) a[i]! += b[i]!;
  return a;
};

/** Deletes rollups of minutes before `before` (retention); returns how many rows went. */
export async function pruneRollups(db: Queryable, before: Date): Promise<number> {
  const { rowCount } = await db.query('DELETE FROM pool_metrics_minute WHERE minute < $1', [before]);
  return rowCount;
}

/** Sums of one pool's minutes in [from, to); a null bound is open. Sums come back as numbers. */
export async function sumRollups(db: Queryable, poolId: number, from: Date | null, to: Date | null): Promise<RollupTotals> {
  // float8 keeps the sums numbers on both engines (bigint sums are numeric → strings); exact below 2^53.
  const { rows } = await db.query<RollupTotals>(
    `SELECT COALESCE(sum(requests), 0)::float8 AS requests, COALESCE(sum(admitted), 0)::float8 AS admitted,
            COALESCE(sum(queued), 0)::float8 AS queued, COALESCE(sum(rejected), 0)::float8 AS rejected
       FROM pool_metrics_minute
      WHERE pool_id = $1 AND ($2::timestamptz IS NULL OR minute >= $2) AND ($3::timestamptz IS NULL OR minute < $3)`,
    [poolId, from, to],
  );
  const r = rows[0]!;
  return { requests: Number(r.requests), admitted: Number(r.admitted), queued: Number(r.queued), rejected: Number(r.rejected) };
}

export interface MinuteRow {
  minute: Date;
  requests: number;
  admitted: number;
  queued: number;
  rejected: number;
  upstream_errors: number;
  queue_wait_p50_ms: number | null;
  queue_wait_p95_ms: number | null;
  upstream_p50_ms: number | null;
  upstream_p95_ms: number | null;
  effective_limit: number | null;
}

/** One pool's per-minute rollups from `from` on, oldest first (the dashboard's charts); percentiles from the histograms. */
export async function minuteRollups(db: Queryable, poolId: number, from: Date): Promise<MinuteRow[]> {
  const { rows } = await db.query<{
    minute: Date | string; requests: number; admitted: number; queued: number; rejected: number; upstream_errors: number;
    queue_wait_hist: (number | string)[] | null; upstream_hist: (number | string)[] | null; effective_limit_min: number | null;
  }>(
    `SELECT minute, requests::float8 AS requests, admitted::float8 AS admitted, queued::float8 AS queued, rejected::float8 AS rejected,
            upstream_errors::float8 AS upstream_errors, queue_wait_hist::float8[] AS queue_wait_hist, upstream_hist::float8[] AS upstream_hist,
            effective_limit_min
       FROM pool_metrics_minute WHERE pool_id = $1 AND minute >= $2 ORDER BY minute`,
    [poolId, from],
  );
  const nums = (h: (number | string)[] | null): number[] | null => (h === null ? null : h.map(Number));
  return rows.map((r) => {
    const qw = nums(r.queue_wait_hist);
    const up = nums(r.upstream_hist);
    return {
      minute: new Date(r.minute),
      requests: Number(r.requests),
      admitted: Number(r.admitted),
      queued: Number(r.queued),
      rejected: Number(r.rejected),
      upstream_errors: Number(r.upstream_errors),
      queue_wait_p50_ms: quantileMs(qw, 0.5),
      queue_wait_p95_ms: quantileMs(qw, 0.95),
      upstream_p50_ms: quantileMs(up, 0.5),
      upstream_p95_ms: quantileMs(up, 0.95),
      effective_limit: r.effective_limit_min === null ? null : Number(r.effective_limit_min),
    };
  });
}
