// The data plane side of async jobs: whether a request becomes a job, and turning it into one — the body
// read (capped), the request spilled in one INSERT, then 202 with the job id and its poll URL.
import { encodeWhole, type HeaderList, type ResponseEncoder } from '../pool-request/codec.js';
import { reply, type Exchange, type Reply } from '../pool-request/exchange.js';
import { connectionListed, isHopByHop } from '../pool-request/headers.js';
import type { RequestBody } from '../pool-request/request-body.js';
import { BodyLimit, BodyTooLargeError } from '../pool-request/body-limit.js';
import type { Settlement } from '../pool-request/release.js';
import type { PoolEntry } from '../pool-request/snapshot.js';
import type { Logger } from '../log.js';
import type { Queryable } from '../store/sql.js';
import type { JobReason } from './job-event.js';
import { newJobId } from './job-id.js';
import type { SecretBox } from '../security/secret-box.js';
import { spillJob, type NewJob, type StoredRequest } from './job-store.js';
import { JOB_BODY_CAP } from './job-limits.js';
import { pollUrl } from './result-view.js';

export interface JobIntake {
  /** Stores the job (its INSERT): on the store here, or through the main thread from a worker thread. */
  spill: (job: NewJob) => Promise<void>;
  log: Logger;
  /** Public address of the lock/pool API, where jobs are polled. */
  lockApiUrl: () => string;
}

/** The intake of a process that holds the store: one INSERT per job. */
export function storeIntake(sql: Queryable, box: SecretBox, log: Logger, lockApiUrl: () => string): JobIntake {
  return { spill: (job) => spillJob(sql, box, job), log, lockApiUrl };
}

/** Async is on for the pool and it has at least one active destination (spec rule 5). */
export function asyncEligible(pool: PoolEntry): boolean {
  return pool.asyncEnabled && pool.hasActiveDestination;
}

/** `X-Service-Async: true` (also 1/yes, any case). */
export function asyncRequested(headers: Record<string, string>): boolean {
  const v = headers['x-service-async'];
  if (v === undefined) return false;
  const s = v.trim().toLowerCase();
  return s === 'true' || s === '1' || s === 'yes';
}

/** The 413 rule (src/pool-request/body-limit.ts) for a job's request body. */
const JOB_BODY = new BodyLimit(JOB_BODY_CAP, `an async job's request body is limited to ${JOB_BODY_CAP} bytes`);

/** The declared body is too large to spill with a job. */
export function tooLargeForJob(headers: Record<string, string>): boolean {
  return JOB_BODY.declaredOver(headers);
}

export const JOB_TOO_LARGE: Reply = JOB_BODY.reply;

/** The client's headers as stored: pool auth, our control headers and hop-by-hop headers removed. */
export function storableHeaders(ex: Exchange): Record<string, string> {
  const listed = connectionListed(ex.headers.connection);
  const out: Record<string, string> = {};
  for (const name in ex.headers) {
    if (isHopByHop(name, listed) || name === 'content-length' || name.startsWith('x-service-')) continue;
    if (name === 'authorization' && ex.keyInAuthorization) continue;
    out[name] = ex.headers[name]!;
  }
  return out;
}

class JobBodyTooLarge extends Error {}

/** Reads the whole request body into memory, refusing more than JOB_BODY_CAP bytes. */
async function readBody(body: RequestBody): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  body.release();
  for await (const chunk of body as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > JOB_BODY_CAP) {
      body.destroy();
      throw new JobBodyTooLarge();
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, size);
}

/**
 * Turns the request into a job and answers 202 `{ id, status, reason, poll_url, result_url }` once the
 * job is stored. Resolves (never rejects) with how the request ended.
 */
export async function acceptJob(intake: JobIntake, ex: Exchange, client: ResponseEncoder, body: RequestBody | null, reason: JobReason): Promise<Settlement> {
  const fail = (r: Reply, closeConnection: boolean): Settlement => {
    client.sendReply(r, null, closeConnection);
    return { outcome: r.error, status: r.status };
  };
  let bytes: Buffer | null = null;
  if (body) {
    // A client that leaves mid-body ends the read (the stream itself would just stop delivering).
    client.onAbort(() => body.destroy(new Error('the client went away')));
    try {
      bytes = await readBody(body);
    } catch (err) {
      if (client.aborted) return { outcome: 'client_aborted', status: 0 };
      if (err instanceof JobBodyTooLarge) return fail(JOB_TOO_LARGE, true);
      // The data plane's own body limit (the 413 rule: src/pool-request/body-limit.ts).
      if (err instanceof BodyTooLargeError) return fail(err.limit.reply, true);
      // The client broke off mid-body.
      return fail(reply(413, 'payload_too_large', (err as Error).message || 'request body too large'), true);
    }
  }
  if (client.aborted) return { outcome: 'client_aborted', status: 0 };
  return spillAndAnswer(intake, ex, client, bytes, reason);
}

/**
 * Stores a request whose body is already in hand (SQL over HTTP reads it whole before admission) as a job
 * and answers 202. Resolves (never rejects) with how the request ended.
 */
export async function spillAndAnswer(intake: JobIntake, ex: Exchange, client: ResponseEncoder, bytes: Buffer | null, reason: JobReason): Promise<Settlement> {
  const pool = ex.pool!;
  const fail = (r: Reply): Settlement => {
    client.sendReply(r, null, false);
    return { outcome: r.error, status: r.status };
  };
  const id = newJobId();
  const request: StoredRequest = {
    method: ex.method,
    path: ex.path,
    query: ex.query,
    headers: storableHeaders(ex),
    clientAddress: ex.clientAddress,
    body: bytes,
  };
  try {
    await intake.spill({ id, poolId: pool.id, reason, ttlMs: pool.settings.jobTtlMs, request });
  } catch (err) {
    intake.log.error({ err, poolId: pool.id }, 'spilling an async job failed');
    return fail(reply(503, 'unavailable', 'the job could not be stored; retry later'));
  }
  const poll = pollUrl(intake.lockApiUrl(), pool.subdomain, id);
  const text = JSON.stringify({ id, status: 'queued', reason, poll_url: poll, result_url: `${poll}/result` });
  if (!client.open) return { outcome: 'job_accepted', status: 0 };
  const headers: HeaderList = [
    ['content-type', 'application/json'],
    ['location', poll],
    ['x-service-job-id', id],
  ];
  encodeWhole(client, ex.method === 'HEAD', 202, headers, Buffer.from(text));
  return { outcome: 'job_accepted', status: 202 };
}
