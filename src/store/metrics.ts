// Per-pool per-minute traffic rollups (pool_metrics_minute): the data plane's batch writer, retention
// pruning, and the sums the metrics summary reads.
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
  for (const r of rows) {
    if (!isCount(r.poolId) || Number.isNaN(r.minute.getTime()) || ![r.requests, r.admitted, r.queued, r.rejected].every(isCount)) {
      throw new TypeError(`invalid metrics rollup: ${JSON.stringify(r)}`);
    }
  }
  await db.query(
    `INSERT INTO pool_metrics_minute AS m (pool_id, minute, requests, admitted, queued, rejected)
     SELECT u.pool_id, date_trunc('minute', u.minute), sum(u.requests), sum(u.admitted), sum(u.queued), sum(u.rejected)
       FROM unnest($1::int4[], $2::timestamptz[], $3::int8[], $4::int8[], $5::int8[], $6::int8[])
            AS u (pool_id, minute, requests, admitted, queued, rejected)
      WHERE EXISTS (SELECT 1 FROM pools p WHERE p.id = u.pool_id)
      GROUP BY u.pool_id, date_trunc('minute', u.minute)
     ON CONFLICT (pool_id, minute) DO UPDATE SET
       requests = m.requests + EXCLUDED.requests,
       admitted = m.admitted + EXCLUDED.admitted,
       queued   = m.queued + EXCLUDED.queued,
       rejected = m.rejected + EXCLUDED.rejected`,
    [
      rows.map((r) => r.poolId),
      rows.map((r) => r.minute.toISOString()),
      rows.map((r) => r.requests),
      rows.map((r) => r.admitted),
      rows.map((r) => r.queued),
      rows.map((r) => r.rejected),
    ],
  );
}

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
}

/** One pool's per-minute rollups from `from` on, oldest first (the dashboard's charts). */
export async function minuteRollups(db: Queryable, poolId: number, from: Date): Promise<MinuteRow[]> {
  const { rows } = await db.query<MinuteRow>(
    `SELECT minute, requests::float8 AS requests, admitted::float8 AS admitted, queued::float8 AS queued, rejected::float8 AS rejected
       FROM pool_metrics_minute WHERE pool_id = $1 AND minute >= $2 ORDER BY minute`,
    [poolId, from],
  );
  return rows.map((r) => ({ minute: new Date(r.minute), requests: Number(r.requests), admitted: Number(r.admitted), queued: Number(r.queued), rejected: Number(r.rejected) }));
}
