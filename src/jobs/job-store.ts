// The jobs table: spill, claim under a lease, finish (result + terminal status), retry, expire, recover.
// Every move to a terminal status is one UPDATE fenced by the claim (or the status), and its caller
// writes the event to the outbox in the same transaction.
import { randomBytes } from 'node:crypto';
import type { JobReason, TerminalStatus } from './job-event.js';
import { JOBS_CHANNEL } from './job-limits.js';
import type { Queryable } from '../store/sql.js';
import type { BufferedRequest } from '../pool-request/buffered.js';
import type { SecretBox } from '../security/secret-box.js';

export type JobStatus = 'queued' | 'running' | TerminalStatus;

/** A request as stored with its job: what the runner sends from memory (pool auth and hop-by-hop removed). */
export type StoredRequest = BufferedRequest;

export interface NewJob {
  id: string;
  poolId: number;
  reason: JobReason;
  ttlMs: number;
  request: StoredRequest;
}

/** bytea comes back as a Buffer from pg and as a Uint8Array from PGlite. */
export function toBuffer(v: unknown): Buffer | null {
  if (v === null || v === undefined) return null;
  if (Buffer.isBuffer(v)) return v;
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  throw new TypeError('not a byte value');
}

const ms = (v: Date | string | null): number | null => (v === null ? null : new Date(v).getTime());

/**
 * A stored request's headers and body are the client's secrets (cookies, Authorization for the origin, the
 * payload): sealed with the master key like other secrets (AES-256-GCM, src/security/secret-box.ts). The
 * headers column (jsonb) holds `{"sealed": "v1:…"}`; the body column the sealed bytes.
 */
function sealHeaders(box: SecretBox, headers: Record<string, string>): string {
  return JSON.stringify({ sealed: box.seal(JSON.stringify(headers)) });
}

/** The stored request's headers and body in the clear; a row spilled before sealing (no `sealed` key) is read as it is. */
function openRequest(box: SecretBox, headers: Record<string, string> | string, body: unknown): { headers: Record<string, string>; body: Buffer | null } {
  const v = typeof headers === 'string' ? (JSON.parse(headers) as Record<string, string>) : headers;
  const bytes = toBuffer(body);
  if (typeof v.sealed !== 'string' || Object.keys(v).length !== 1) return { headers: v, body: bytes };
  return { headers: JSON.parse(box.open(v.sealed)) as Record<string, string>, body: bytes === null ? null : box.openBytes(bytes) };
}

/**
 * Spills a job: one statement that inserts the row and wakes runners (NOTIFY is delivered on commit,
 * so a runner never looks before the row is visible).
 */
export async function spillJob(db: Queryable, box: SecretBox, job: NewJob): Promise<void> {
  const r = job.request;
  await db.query(
    `WITH j AS (
       INSERT INTO jobs (id, pool_id, reason, method, path, query, headers, client_address, body, expires_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, now() + $10::double precision * interval '1 millisecond')
       RETURNING pool_id)
     SELECT pg_notify($11, pool_id::text) FROM j`,
    [job.id, job.poolId, job.reason, r.method, r.path, r.query, sealHeaders(box, r.headers), r.clientAddress, r.body === null ? null : box.sealBytes(r.body), job.ttlMs, JOBS_CHANNEL],
  );
}

export interface ClaimedJob {
  id: string;
  poolId: number;
  reason: JobReason;
  /** Attempts including this one. */
  attempts: number;
  claimToken: string;
  createdAt: number;
  request: StoredRequest;
}

interface ClaimRow {
  id: string;
  pool_id: number;
  reason: JobReason;
  attempts: number;
  created_at: Date | string;
  method: string;
  path: string;
  query: string;
  headers: Record<string, string> | string;
  client_address: string;
  body: unknown;
}

/** Pools that have a job ready to run now. */
export async function poolsWithReadyJobs(db: Queryable): Promise<number[]> {
  const { rows } = await db.query<{ pool_id: number }>(
    `SELECT DISTINCT pool_id FROM jobs WHERE status = 'queued' AND run_after <= now() AND expires_at > now()`,
  );
  return rows.map((r) => r.pool_id);
}

/** Claims the oldest ready job of a pool (skipping rows another runner holds), leased for leaseMs. */
export async function claimJob(db: Queryable, box: SecretBox, poolId: number, leaseMs: number): Promise<ClaimedJob | null> {
  const token = randomBytes(16).toString('hex');
  const { rows } = await db.query<ClaimRow>(
    `UPDATE jobs SET status = 'running', attempts = attempts + 1, claim_token = $2,
            lease_until = now() + $3::double precision * interval '1 millisecond'
      WHERE id = (SELECT id FROM jobs
                   WHERE pool_id = $1 AND status = 'queued' AND run_after <= now() AND expires_at > now()
                   ORDER BY run_after, created_at LIMIT 1 FOR UPDATE SKIP LOCKED)
      RETURNING id, pool_id, reason, attempts, created_at, method, path, query, headers, client_address, body`,
    [poolId, token, leaseMs],
  );
  const row = rows[0];
  if (!row) return null;
  const opened = openRequest(box, row.headers, row.body);
  return {
    id: row.id,
    poolId: row.pool_id,
    reason: row.reason,
    attempts: row.attempts,
    claimToken: token,
    createdAt: ms(row.created_at)!,
    request: {
      method: row.method,
      path: row.path,
      query: row.query,
      headers: opened.headers,
      clientAddress: row.client_address,
      body: opened.body,
    },
  };
}

export interface StoredResult {
  status: number;
  headers: Record<string, string | string[]>;
  body: Buffer;
  truncated: boolean;
}

/** Terminal move of a claimed job; null when the claim was lost (lease lapsed and another runner took it). */
export async function finishClaimed(
  db: Queryable,
  job: Pick<ClaimedJob, 'id' | 'claimToken'>,
  status: 'completed' | 'failed',
  result: StoredResult | null,
  error: string | null,
): Promise<{ completedAt: number } | null> {
  const { rows } = await db.query<{ completed_at: Date | string }>(
    `UPDATE jobs SET status = $3, result_status = $4, result_headers = $5::jsonb, result_body = $6,
            result_truncated = $7, error = $8, claim_token = NULL, lease_until = NULL, completed_at = now()
      WHERE id = $1 AND claim_token = $2 AND status = 'running'
      RETURNING completed_at`,
    [job.id, job.claimToken, status, result?.status ?? null, result ? JSON.stringify(result.headers) : null, result?.body ?? null, result?.truncated ?? false, error],
  );
  return rows[0] ? { completedAt: ms(rows[0].completed_at)! } : null;
}

/** Puts a claimed job back in the queue after an attempt that got no answer; false when the claim was lost. */
export async function retryLater(db: Queryable, job: Pick<ClaimedJob, 'id' | 'claimToken'>, delayMs: number, error: string): Promise<boolean> {
  const { rowCount } = await db.query(
    `UPDATE jobs SET status = 'queued', claim_token = NULL, lease_until = NULL, error = $3,
            run_after = now() + $4::double precision * interval '1 millisecond'
      WHERE id = $1 AND claim_token = $2 AND status = 'running'`,
    [job.id, job.claimToken, error, delayMs],
  );
  return rowCount > 0;
}

/** A job that reached a terminal status outside a runner's claim (expiry, a lease lapsed on the last attempt). */
export interface SweptJob {
  id: string;
  poolId: number;
  subdomain: string;
  status: 'expired' | 'failed';
  reason: JobReason;
  createdAt: number;
  completedAt: number;
}

interface SweptRow {
  id: string;
  pool_id: number;
  subdomain: string;
  status: 'expired' | 'failed';
  reason: JobReason;
  created_at: Date | string;
  completed_at: Date | string;
}

const sweptJob = (r: SweptRow): SweptJob => ({
  id: r.id,
  poolId: r.pool_id,
  subdomain: r.subdomain,
  status: r.status,
  reason: r.reason,
  createdAt: ms(r.created_at)!,
  completedAt: ms(r.completed_at)!,
});

/**
 * Queued jobs past their TTL: `expired` when never attempted, `failed` when earlier attempts got no
 * answer and the retry would come too late.
 */
export async function expireJobs(db: Queryable, limit: number): Promise<SweptJob[]> {
  const { rows } = await db.query<SweptRow>(
    `UPDATE jobs j SET status = CASE WHEN j.attempts = 0 THEN 'expired' ELSE 'failed' END,
            error = CASE WHEN j.attempts = 0 THEN 'not run before the job TTL' ELSE j.error END,
            completed_at = now()
       FROM pools p
      WHERE p.id = j.pool_id
        AND j.id IN (SELECT id FROM jobs WHERE status = 'queued' AND expires_at <= now()
                      ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)
      RETURNING j.id, j.pool_id, p.subdomain, j.status, j.reason, j.created_at, j.completed_at`,
    [limit],
  );
  return rows.map(sweptJob);
}

/**
 * What a sweep has to do: `lapsed` when a queued job is past its TTL or a running job's lease lapsed (any
 * running job when `all`), `prune` when a finished job is past retention; and `nextInMs`, how long until the
 * earliest moment anything in the table becomes due (a queued job's run_after or TTL, a lease's end, a finished
 * job's retention; ≤ 0: now; null: no job at all), measured on the store's clock. One read-only statement, so a
 * look at an idle store writes nothing, and the runner can sleep until the next due moment instead of polling:
 * on the embedded store every statement runs on the event loop that serves pool traffic.
 */
export async function sweepDue(db: Queryable, all: boolean, retentionMs: number): Promise<{ lapsed: boolean; prune: boolean; nextInMs: number | null }> {
  const { rows } = await db.query<{ lapsed: boolean; prune: boolean; next_in_ms: number | null }>(
    `SELECT EXISTS (SELECT 1 FROM jobs WHERE status = 'queued' AND expires_at <= now())
         OR EXISTS (SELECT 1 FROM jobs WHERE status = 'running' AND ($1::boolean OR lease_until < now())) AS lapsed,
            EXISTS (SELECT 1 FROM jobs WHERE completed_at < now() - $2::double precision * interval '1 millisecond') AS prune,
            EXTRACT(EPOCH FROM LEAST(
              (SELECT min(LEAST(run_after, expires_at)) FROM jobs WHERE status = 'queued'),
              (SELECT min(lease_until) FROM jobs WHERE status = 'running'),
              (SELECT min(completed_at) FROM jobs WHERE completed_at IS NOT NULL) + $2::double precision * interval '1 millisecond'
            ) - now())::double precision * 1000 AS next_in_ms`,
    [all, retentionMs],
  );
  const r = rows[0];
  return { lapsed: r?.lapsed === true, prune: r?.prune === true, nextInMs: r?.next_in_ms ?? null };
}

/**
 * Running jobs whose lease lapsed (their runner crashed): back to `queued`, or `failed` when that was
 * their last attempt. `all` recovers every running job regardless of its lease: only for a store that
 * one process holds exclusively (the embedded store), where no other runner can hold a claim.
 */
export async function recoverLapsed(db: Queryable, maxAttempts: number, all: boolean, limit: number): Promise<{ requeued: number; failed: SweptJob[] }> {
  const lapsed = `SELECT id FROM jobs WHERE status = 'running' AND ($1::boolean OR lease_until < now())`;
  const failed = await db.query<SweptRow>(
    `UPDATE jobs j SET status = 'failed', error = 'interrupted on the last attempt (runner stopped)',
            claim_token = NULL, lease_until = NULL, completed_at = now()
       FROM pools p
      WHERE p.id = j.pool_id
        AND j.id IN (${lapsed} AND attempts >= $2 LIMIT $3 FOR UPDATE SKIP LOCKED)
      RETURNING j.id, j.pool_id, p.subdomain, j.status, j.reason, j.created_at, j.completed_at`,
    [all, maxAttempts, limit],
  );
  const requeued = await db.query(
    `UPDATE jobs SET status = 'queued', claim_token = NULL, lease_until = NULL, run_after = now()
      WHERE id IN (${lapsed} AND attempts < $2 LIMIT $3 FOR UPDATE SKIP LOCKED)`,
    [all, maxAttempts, limit],
  );
  return { requeued: requeued.rowCount, failed: failed.rows.map(sweptJob) };
}

/** Deletes jobs finished more than retentionMs ago (a bounded batch); returns how many. */
export async function pruneFinished(db: Queryable, retentionMs: number, limit: number): Promise<number> {
  const { rowCount } = await db.query(
    `DELETE FROM jobs WHERE id IN (
       SELECT id FROM jobs WHERE completed_at < now() - $1::double precision * interval '1 millisecond' LIMIT $2)`,
    [retentionMs, limit],
  );
  return rowCount;
}

/** A stored result as read back: `body` is null when it was not loaded (see findJob). */
export interface LoadedResult extends Omit<StoredResult, 'body'> {
  body: Buffer | null;
  size: number;
}

export interface JobView {
  id: string;
  poolId: number;
  status: JobStatus;
  reason: JobReason;
  attempts: number;
  error: string | null;
  createdAt: number;
  completedAt: number | null;
  result: LoadedResult | null;
}

/**
 * One job of a pool (another pool's job is not found). The result body is loaded whole when `fullBody`,
 * and otherwise only when it is small enough to be inlined (`inlineCap`): a poll never reads megabytes
 * it will not show.
 */
export async function findJob(db: Queryable, poolId: number, id: string, fullBody: boolean, inlineCap: number): Promise<JobView | null> {
  const { rows } = await db.query<{
    id: string;
    pool_id: number;
    status: JobStatus;
    reason: JobReason;
    attempts: number;
    error: string | null;
    created_at: Date | string;
    completed_at: Date | string | null;
    result_status: number | null;
    result_headers: Record<string, string | string[]> | string | null;
    result_body: unknown;
    result_size: number | null;
    result_truncated: boolean;
  }>(
    `SELECT id, pool_id, status, reason, attempts, error, created_at, completed_at,
            result_status, result_headers, result_truncated, octet_length(result_body) AS result_size,
            CASE WHEN $3::boolean OR octet_length(result_body) <= $4 THEN result_body END AS result_body
       FROM jobs WHERE id = $1 AND pool_id = $2`,
    [id, poolId, fullBody, inlineCap],
  );
  const r = rows[0];
  if (!r) return null;
  return {
    id: r.id,
    poolId: r.pool_id,
    status: r.status,
    reason: r.reason,
    attempts: r.attempts,
    error: r.error,
    createdAt: ms(r.created_at)!,
    completedAt: ms(r.completed_at),
    result:
      r.result_status === null
        ? null
        : {
            status: r.result_status,
            headers: typeof r.result_headers === 'string' ? JSON.parse(r.result_headers) : (r.result_headers ?? {}),
            body: toBuffer(r.result_body),
            size: r.result_size ?? 0,
            truncated: r.result_truncated,
          },
  };
}
