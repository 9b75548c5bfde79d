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
 * The common table expressions that write a batch of outcomes, parameters $1 to $4 (recordParams): the
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
       SELECT "rowId" AS id, dest, "jobId" AS job_id, "poolId" AS pool_id, ok, status AS http_status, error, attempt,
              "latencyMs" AS latency_ms, "retryMs" AS retry_ms
         FROM jsonb_to_recordset($1::jsonb) AS x("rowId" bigint, dest int, "jobId" text, "poolId" int, ok bool, status int,
              error text, attempt int, "latencyMs" int, "retryMs" int)),
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
       SELECT dest, reset, before, after, "inner" AS inner_run
         FROM jsonb_to_recordset($2::jsonb) AS x(dest int, reset bool, before int, after int, "inner" int)),
     streak AS (
       UPDATE webhook_endpoints w
          SET consecutive_failures = CASE WHEN s.reset THEN s.after ELSE w.consecutive_failures + s.before END,
              disabled = w.disabled OR GREATEST(w.consecutive_failures + s.before, s.inner_run) >= $3,
              updated_at = now()
         FROM s, webhook_endpoints old
        WHERE w.id = s.dest AND old.id = s.dest
          AND (s.before > 0 OR s.inner_run > 0 OR w.consecutive_failures <> CASE WHEN s.reset THEN s.after ELSE w.consecutive_failures END)
        RETURNING w.id, w.disabled AND NOT old.disabled AS deactivated),
     told AS (
       SELECT pg_notify($4, 'webhook:' || id) FROM streak WHERE deactivated),
     deactivated AS (
       SELECT id FROM streak WHERE deactivated AND (SELECT count(*) FROM told) >= 0)`;

/** How many parameters RECORD_CTES takes: a statement's own parameters follow them. */
export const RECORD_PARAMS = 4;

/**
 * RECORD_CTES's parameters for a batch: the outcomes and the streaks each as one JSON array (JSON.stringify is
 * native; ten arrays escaped element by element by pg cost the deliverer more than the statement's round trip).
 */
export function recordParams(outcomes: readonly Outcome[], failuresBeforeDeactivation: number): SqlParam[] {
  const rows = outcomes.some((o) => o.error !== null) ? outcomes.map((o) => (o.error === null ? o : { ...o, error: historyText(o.error) })) : outcomes;
  return [JSON.stringify(rows), JSON.stringify(streakChanges(outcomes)), failuresBeforeDeactivation, CHANGE_CHANNEL];
}

/**
 * An error text as the history can store it: a lone surrogate (a message cut in the middle of a pair) or a NUL
 * would make PostgreSQL refuse the whole batch (JSON or text), so each becomes U+FFFD.
 */
function historyText(text: string): string {
  return text.replace(/\p{Cs}|\0/gu, '\uFFFD');
}

const RECORD_ONLY = `WITH ${RECORD_CTES}\n     SELECT id FROM deactivated`;

/** Writes a batch of outcomes in one statement and returns the destinations it deactivated. */
export async function recordOutcomes(db: Queryable, outcomes: readonly Outcome[], failuresBeforeDeactivation: number): Promise<number[]> {
  if (outcomes.length === 0) return [];
  const { rows } = await db.query<{ id: number }>(RECORD_ONLY, recordParams(outcomes, failuresBeforeDeactivation));
  return rows.map((r) => r.id);
}
