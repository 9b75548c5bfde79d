// Polling a job with pool auth: GET /pools/{pool}/jobs/{id} (status, and the result once completed) and
// GET /pools/{pool}/jobs/{id}/result (the stored response as it came from the origin).
import { authenticateStage } from '../pool-request/authenticate.js';
import { newExchange } from '../pool-request/exchange.js';
import { clientResponseHeaders } from '../pool-request/headers.js';
import type { Snapshot } from '../pool-request/snapshot.js';
import type { PoliciesGate } from '../policies/index.js';
import type { Sql } from '../store/sql.js';
import { errorBody, type HttpCode } from '../errors/catalogue.js';
import { isJobId } from './job-id.js';
import { findJob, type JobView } from './job-store.js';
import { INLINE_BODY_CAP } from './job-limits.js';
import { databaseData, flatHeaders, inlineText, pollUrl } from './result-view.js';

export interface JobPollDeps {
  sql: Sql;
  snapshot: () => Snapshot;
  /** Unix ms; key expiry is checked against it. */
  clock: () => number;
  poolDomain: string;
  lockApiUrl: () => string;
  /** The pools' policies (IP allowlist, access proxy, HMAC, JWT), as on the pool host; absent runs none. */
  policies?: PoliciesGate | null;
}

export interface JobRoute {
  /** Pool subdomain label, lower-cased. */
  pool: string;
  id: string;
  result: boolean;
}

export interface PollRequest {
  method: string;
  path: string;
  /** Names lower-case. */
  headers: Record<string, string>;
  clientAddress: string;
}

export interface PollAnswer {
  status: number;
  headers: Array<[string, string]>;
  body: Buffer;
  /** The length a HEAD answer announces when the body was not loaded; body.length otherwise. */
  length?: number;
}

const LABEL = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;

/** `/pools/{pool}/jobs/{id}` or `…/result` (one trailing slash tolerated); null for any other path. */
export function matchJobRoute(path: string): JobRoute | null {
  const parts = (path.endsWith('/') ? path.slice(0, -1) : path).split('/');
  if (parts[0] !== '' || parts[1] !== 'pools' || parts[3] !== 'jobs' || parts.length < 5 || parts.length > 6) return null;
  const pool = parts[2]!.toLowerCase();
  if (!LABEL.test(pool)) return null;
  if (parts.length === 6 && parts[5] !== 'result') return null;
  return { pool, id: parts[4]!, result: parts.length === 6 };
}

const json = (status: number, value: unknown, extra: Array<[string, string]> = []): PollAnswer => ({
  status,
  headers: [['content-type', 'application/json'], ['cache-control', 'no-store'], ...extra],
  body: Buffer.from(JSON.stringify(value)),
});
const error = (status: number, code: HttpCode, message: string, extra: Array<[string, string]> = []) => json(status, errorBody(code, message), extra);

/** The poll answer's JSON (documented in docs/jobs-and-webhooks.md). */
export function jobJson(job: JobView, poolHost: string, poll: string, database = false): Record<string, unknown> {
  let result: Record<string, unknown> | null = null;
  if (job.result && database) {
    // A database pool's answer as JSON: `data` is the sync endpoint's body (or `{error}`), inline when it fits.
    const text = job.result.body === null || job.result.truncated ? null : inlineText(job.result.body);
    result = {
      status: job.result.status,
      ...(text === null ? {} : { data: databaseData(job.result.status, text) }),
      truncated: job.result.truncated,
      result_url: `${poll}/result`,
    };
  } else if (job.result) {
    const text = job.result.body === null ? null : inlineText(job.result.body);
    result = {
      status: job.result.status,
      headers: flatHeaders(job.result.headers),
      ...(text === null ? {} : { body: text }),
      truncated: job.result.truncated,
      result_url: `${poll}/result`,
    };
  }
  return {
    id: job.id,
    status: job.status,
    reason: job.reason,
    pool: poolHost,
    attempts: job.attempts,
    created_at: job.createdAt,
    completed_at: job.completedAt,
    error: job.error,
    result,
  };
}

/** Answers one poll request; authentication is the pool's (key in X-Service-Key or Bearer). */
export async function answerJobPoll(deps: JobPollDeps, route: JobRoute, req: PollRequest): Promise<PollAnswer> {
  if (req.method !== 'GET' && req.method !== 'HEAD') return error(405, 'method_not_allowed', 'jobs are read with GET', [['allow', 'GET, HEAD']]);
  const snapshot = deps.snapshot();
  const pool = snapshot.pools.get(route.pool);
  if (!pool) return error(404, 'not_found', 'no such pool');
  const ex = newExchange(req.method, req.path, '', req.headers, req.clientAddress, snapshot);
  ex.pool = pool;
  const refused = authenticateStage(deps.clock)(ex);
  if (refused) return error(refused.status, refused.error, refused.message);
  if (deps.policies) {
    // A result is as protected as the pool: an allowlist miss or a bad signature reads nothing.
    const v = await deps.policies({ ...ex, pool, peer: req.clientAddress }, Buffer.alloc(0));
    if (v !== null) return error(v.status, v.status === 401 || v.status === 403 ? 'unauthorized' : v.status === 413 ? 'payload_too_large' : 'unavailable', v.message);
  }
  // An id that cannot be a job id, or a job of another pool, is simply not found.
  const job = isJobId(route.id) ? await findJob(deps.sql, pool.id, route.id, route.result && req.method !== 'HEAD', INLINE_BODY_CAP) : null;
  if (!job) return error(404, 'not_found', 'no such job');
  const poll = pollUrl(deps.lockApiUrl(), pool.subdomain, job.id);
  if (!route.result) return json(200, jobJson(job, `${pool.subdomain}.${deps.poolDomain}`, poll, pool.backend !== 'http'));
  if (!job.result) {
    const done = job.status === 'failed' || job.status === 'expired';
    return error(409, done ? 'no_result' : 'not_ready', done ? `the job is ${job.status} and has no result` : `the job is ${job.status}; poll ${poll}`);
  }
  const headers: Array<[string, string]> = clientResponseHeaders(job.result.headers);
  headers.push(['x-service-job-id', job.id], ['x-service-job-status', job.status]);
  if (job.result.truncated) headers.push(['x-service-job-truncated', 'true']);
  // HEAD did not load the body: announce its stored length.
  return { status: job.result.status, headers, body: job.result.body ?? Buffer.alloc(0), length: job.result.size };
}
