// Recording finished deliveries in batches: every outcome gathered since the last write goes to the store in
// one statement — the attempts for the history, each row delivered, rescheduled or given up, and each
// destination's failure streak (8 consecutive failures deactivate it; any success resets it). The deliverer
// sends the batch in the statement that claims its next rows (claim.ts).
import type { Queryable, SqlParam } from '../store/sql.js';
import { CHANGE_CHANNEL } from '../store/sql.js';

export interface Outcome {
  rowId: string;
  dest: number;
  jobId: string;
  poolId: number | null;
  ok: boolean;
  status: number | null;
  error: string | null;
  attempt: number;
  latencyMs: number;
  /** Failed and retried: wait before the next attempt. Null: finished (delivered, or given up). */
  retryMs: number | null;
}

/**
 * One destination's outcomes in the order they came back, summed up for the streak:
 * with no success the streak grows by `before` (every failure); with a success it restarts at `after`
 * (the failures after the last success). `peakAdd`: the streak peaks at max(old + before, inner), where
 * `inner` is the longest run of failures after the first success.
 */
export interface StreakChange {
  dest: number;
  reset: boolean;
  before: number;
  after: number;
  inner: number;
}

export function streakChanges(outcomes: readonly Outcome[]): StreakChange[] {
  const by = new Map<number, StreakChange & { run: number }>();
  for (const o of outcomes) {
    let s = by.get(o.dest);
    if (!s) by.set(o.dest, (s = { dest: o.dest, reset: false, before: 0, after: 0, inner: 0, run: 0 }));
    if (o.ok) {
      s.reset = true;
      s.run = 0;
    } else if (!s.reset) {
      s.before++;
    } else {
      s.run++;
      s.inner = Math.max(s.inner, s.run);
    }
    s.after = s.reset ? s.run : 0;
  }
  return [...by.values()].map(({ run: _run, ...s }) => s);
}

/**
 * The common table expressions that write a batch of outcomes, parameters $1 to $17 (recordParams): the
 * attempts for the history, each row's new state, each destination's streak, and `deactivated`, the
 * destinations this batch deactivated (their change notification is sent in the same statement, so the data
 * plane learns of it at commit). A statement that writes outcomes starts `WITH` these and selects from
 * `deactivated`; the deliverer's claim follows them in the same statement (claim.ts).
 *
 * Locks: the statement updates destination rows (FOR NO KEY UPDATE) and inserts attempts that reference
 * them (FOR KEY SHARE, which does not conflict); there is no SELECT … FOR UPDATE, which deadlocked
 * against the attempts' foreign-key locks when two recordings ran at once on PostgreSQL.
 */
export const RECORD_CTES = `o AS (
       SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[], $4::int[], $5::bool[], $6::int[], $7::text[], $8::int[], $9::int[], $10::int[])
              AS o(id, dest, job_id, pool_id, ok, http_status, error, attempt, latency_ms, retry_ms)),
     attempts AS (
       INSERT INTO webhook_delivery_attempts (webhook_endpoint_id, job_id, pool_id, result, http_status, error, attempt, latency_ms)
       SELECT dest, job_id, pool_id, CASE WHEN ok THEN 'success' ELSE 'failure' END, http_status, error, attempt, latency_ms FROM o),
     rows AS (
       UPDATE webhook_deliveries d
          SET status = CASE WHEN o.ok THEN 'delivered' WHEN o.retry_ms IS NULL THEN 'failed' ELSE 'pending' END,
              finished_at = CASE WHEN o.retry_ms IS NULL THEN now() END,
              next_attempt_at = CASE WHEN o.retry_ms IS NULL THEN d.next_attempt_at ELSE now() + o.retry_ms * interval '1 millisecond' END
         FROM o WHERE d.id = o.id AND d.status = 'pending'),
     s AS (
       SELECT * FROM unnest($11::int[], $12::bool[], $13::int[], $14::int[], $15::int[]) AS s(dest, reset, before, after, inner_run)),
     streak AS (
       UPDATE webhook_endpoints w
          SET consecutive_failures = CASE WHEN s.reset THEN s.after ELSE w.consecutive_failures + s.before END,
              disabled = w.disabled OR GREATEST(w.consecutive_failures + s.before, s.inner_run) >= $16,
              updated_at = now()
         FROM s, webhook_endpoints old
        WHERE w.id = s.dest AND old.id = s.dest
          AND (s.before > 0 OR s.inner_run > 0 OR w.consecutive_failures <> CASE WHEN s.reset THEN s.after ELSE w.consecutive_failures END)
        RETURNING w.id, w.disabled AND NOT old.disabled AS deactivated),
     told AS (
       SELECT pg_notify($17, 'webhook:' || id) FROM streak WHERE deactivated),
     deactivated AS (
       SELECT id FROM streak WHERE deactivated AND (SELECT count(*) FROM told) >= 0)`;

/** How many parameters RECORD_CTES takes: a statement's own parameters follow them. */
export const RECORD_PARAMS = 17;

/** RECORD_CTES's parameters for a batch. */
export function recordParams(outcomes: readonly Outcome[], failuresBeforeDeactivation: number): SqlParam[] {
  const streaks = streakChanges(outcomes);
  return [
      outcomes.map((o) => o.rowId),
      outcomes.map((o) => o.dest),
      outcomes.map((o) => o.jobId),
      outcomes.map((o) => o.poolId),
      outcomes.map((o) => o.ok),
      outcomes.map((o) => o.status),
      outcomes.map((o) => o.error),
      outcomes.map((o) => o.attempt),
      outcomes.map((o) => o.latencyMs),
      outcomes.map((o) => o.retryMs),
      streaks.map((s) => s.dest),
      streaks.map((s) => s.reset),
      streaks.map((s) => s.before),
      streaks.map((s) => s.after),
      streaks.map((s) => s.inner),
      failuresBeforeDeactivation,
      CHANGE_CHANNEL,
  ];
}

const RECORD_ONLY = `WITH ${RECORD_CTES}\n     SELECT id FROM deactivated`;

/** Writes a batch of outcomes in one statement and returns the destinations it deactivated. */
export async function recordOutcomes(db: Queryable, outcomes: readonly Outcome[], failuresBeforeDeactivation: number): Promise<number[]> {
  if (outcomes.length === 0) return [];
  const { rows } = await db.query<{ id: number }>(RECORD_ONLY, recordParams(outcomes, failuresBeforeDeactivation));
  return rows.map((r) => r.id);
}
