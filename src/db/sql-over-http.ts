// SQL over HTTP on a database pool's host: `POST {query, params}` → `{columns, rows}`, or
// `POST {queries: [...]}` → `{results: [...]}` in one transaction. The request is read and checked before it
// takes a slot; the slot is held from admission until the answer is written.
import type { Config } from '../config/schema.js';
import type { Admission, Governor, Outcome } from '../governor/governor.js';
import type { Logger } from '../log.js';
import { governorHeaders, refusalReply } from '../pool-request/refusal.js';
import { admit } from '../pool-request/admit.js';
import { BodyLimit } from '../pool-request/body-limit.js';
import type { HeaderList, ResponseEncoder } from '../pool-request/codec.js';
import { reply, type Exchange, type Reply, type Stage } from '../pool-request/exchange.js';
import type { Settlement } from '../pool-request/release.js';
import { requestFailed } from '../pool-request/request-failed.js';
import type { PoolEntry, Snapshot } from '../pool-request/snapshot.js';
import { asyncEligible, asyncRequested, JOB_TOO_LARGE, spillAndAnswer, type JobIntake } from '../jobs/job-intake.js';
import type { JobReason } from '../jobs/job-event.js';
import { JOB_BODY_CAP } from '../jobs/job-limits.js';
import type { SqlJobOutcome } from '../jobs/sql-job.js';
import { failureBody, type DbFailure } from './errors.js';
import { errorBody, httpStatus } from '../errors/catalogue.js';
import { DbUpstreams, type RunResult, type SqlStatement, type StatementResult } from './upstream.js';
import { UpstreamPools } from './upstream-pool.js';

/** The most statements one `queries` batch may hold. */
export const MAX_BATCH = 1000;
/** PostgreSQL's protocol limit on bind parameters; applied to both backends. */
export const MAX_PARAMS = 65535;

export type SqlRequest = { kind: 'single'; statement: SqlStatement } | { kind: 'batch'; statements: SqlStatement[] };

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

function statementOf(v: unknown, where: string): SqlStatement | string {
  if (!isObject(v)) return `${where} must be an object with "query" and optional "params"`;
  for (const k of Object.keys(v)) if (k !== 'query' && k !== 'params') return `${where} has an unknown property "${k}"`;
  if (typeof v.query !== 'string' || v.query.trim() === '') return `${where}.query must be a non-empty string`;
  if (v.query.includes('\u0000')) return `${where}.query must not contain NUL characters`;
  const params = v.params ?? [];
  if (!Array.isArray(params)) return `${where}.params must be an array`;
  if (params.length > MAX_PARAMS) return `${where}.params has more than ${MAX_PARAMS} values`;
  return { query: v.query, params };
}

/** Parses and checks a request body; a string says what is wrong (answered 400). */
export function parseSqlRequest(text: string): SqlRequest | string {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return 'the body must be JSON: {"query": "...", "params": [...]} or {"queries": [...]}';
  }
  if (!isObject(body)) return 'the body must be a JSON object: {"query": "...", "params": [...]} or {"queries": [...]}';
  if ('queries' in body) {
    for (const k of Object.keys(body)) if (k !== 'queries') return `a batch has only "queries"; unknown property "${k}"`;
    const list = body.queries;
    if (!Array.isArray(list) || list.length === 0) return '"queries" must be a non-empty array';
    if (list.length > MAX_BATCH) return `"queries" holds at most ${MAX_BATCH} statements`;
    const statements: SqlStatement[] = [];
    for (let i = 0; i < list.length; i++) {
      const s = statementOf(list[i], `queries[${i}]`);
      if (typeof s === 'string') return s;
      statements.push(s);
    }
    return { kind: 'batch', statements };
  }
  const s = statementOf(body, 'the body');
  return typeof s === 'string' ? s : { kind: 'single', statement: s };
}

/** One statement's JSON form. */
function resultJson(r: StatementResult): Record<string, unknown> {
  const out: Record<string, unknown> = { command: r.command, rowCount: r.rowCount, columns: r.columns, rows: r.rows };
  if (r.lastInsertId !== undefined) out.lastInsertId = r.lastInsertId;
  return out;
}

/** The 200 body of a request: the statement's result, or `{results}` for a batch. */
export function responseJson(req: SqlRequest, results: StatementResult[]): Record<string, unknown> {
  return req.kind === 'single' ? resultJson(results[0]!) : { results: results.map(resultJson) };
}

function statementsOf(req: SqlRequest): SqlStatement[] {
  return req.kind === 'single' ? [req.statement] : req.statements;
}

function errorJson(f: Exclude<DbFailure, { kind: 'aborted' }>, index: number | undefined): { status: number; body: Record<string, unknown> } {
  const r = failureBody(f);
  if (index !== undefined) r.body.index = index;
  return r;
}

/**
 * Runs a stored SQL request (the body a client POSTed to a database pool) for the async jobs runner, with
 * the pool's request timeout. The caller holds the slot. Resolves, never rejects.
 */
export async function runSqlRequest(upstreams: DbUpstreams, pool: PoolEntry, body: Buffer | string, signal?: AbortSignal): Promise<SqlJobOutcome> {
  const req = parseSqlRequest(typeof body === 'string' ? body : body.toString('utf8'));
  if (typeof req === 'string') return { ok: false, status: httpStatus('bad_request'), body: errorBody('bad_request', req) };
  const r = await upstreams.run(pool, statementsOf(req), { timeoutMs: pool.settings.requestTimeoutMs, signal, transaction: req.kind === 'batch' });
  if (r.ok) return { ok: true, status: 200, detail: { kind: 'database', ...responseJson(req, r.results) } };
  if (r.failure.kind === 'aborted') return { ok: false, status: httpStatus('unavailable'), body: errorBody('unavailable', 'the job was cancelled') };
  return { ok: false, ...errorJson(r.failure, r.index) };
}

// ------------------------------------------------------------------------------------ the endpoint

export interface SqlOverHttpOptions {
  config: Config;
  governor: Governor;
  log: Logger;
  /** Async jobs: where requests of async database pools are spilled; null serves every request synchronously. */
  jobs?: JobIntake | null;
}

const METHOD_NOT_ALLOWED = reply(405, 'method_not_allowed', 'a database pool takes every query as a POST', [['allow', 'POST']]);
const NO_CREDENTIAL = reply(503, 'unavailable', 'this database pool has no database credential attached');

/**
 * The SQL target stage, first after the policies on a database pool: every query is a POST (405 with Allow,
 * decided after the key), and the pool must have its database credential attached (503).
 */
export const sqlTargetStage: Stage = (ex: Exchange) => {
  if (ex.method !== 'POST') return METHOD_NOT_ALLOWED;
  const pool = ex.pool!;
  return !pool.database || pool.credential?.method !== 'postgres_role' ? NO_CREDENTIAL : null;
};

/** The settlement of an answered run: the outcome the access log and metrics use, and the governor sample. */
function settlementOf(r: RunResult, status: number, latencyMs: number): Settlement {
  const upstream: Outcome = { status, latencyMs };
  if (r.ok || r.failure.kind === 'database') return { outcome: 'proxied', status, upstream };
  switch (r.failure.kind) {
    case 'timeout':
      return { outcome: 'upstream_timeout', status, upstream: { dropped: true, latencyMs } };
    case 'unavailable':
      return { outcome: 'unavailable', status, upstream: { dropped: true, latencyMs } };
    default:
      return { outcome: 'upstream_unreachable', status, upstream: { dropped: true, latencyMs } };
  }
}

export class SqlOverHttp {
  readonly upstreams: DbUpstreams;
  readonly #opts: SqlOverHttpOptions;

  readonly #bodyLimit: BodyLimit;

  constructor(opts: SqlOverHttpOptions) {
    this.#opts = opts;
    this.#bodyLimit = new BodyLimit(opts.config.sqlBodyLimit, `request body exceeds ${opts.config.sqlBodyLimit} bytes (the operator sets it: POOLGATE_SQL_BODY_LIMIT)`);
    this.upstreams = new DbUpstreams({
      allowInsecure: opts.config.dbAllowInsecure,
      allowPrivate: opts.config.allowPrivateTargets,
      log: opts.log,
      pools: new UpstreamPools(opts.config.dbIdleTimeoutMs),
    });
  }

  /** Retires upstream connection pools whose pool was deleted or whose host, role or size changed. */
  sync(snapshot: Snapshot): void {
    this.upstreams.sync(snapshot);
  }

  close(): Promise<void> {
    return this.upstreams.close();
  }

  /** The 413 rule for SQL over HTTP bodies (POOLGATE_SQL_BODY_LIMIT), declared and read. */
  get bodyLimit(): BodyLimit {
    return this.#bodyLimit;
  }

  /**
   * The chain's end on a database pool: the stages before it (route, authenticate, scope, policies, the SQL
   * target check, the 413 rule, the wait, the async check) have run and written the Exchange: its body source
   * (null when the request has none), the policies' pending verdict and the queue wait. Must be called
   * synchronously from the uWS handler: it registers the body reader. `settle` runs exactly once.
   */
  serve(ex: Exchange, client: ResponseEncoder, settle: (s: Settlement) => void): void {
    const onData = ex.body;
    const verdict = ex.verdict;
    const wait = ex.waitMs;
    const limit = this.#bodyLimit;
    const bodyPresent = onData !== null;
    const stop = (r: Reply) => {
      client.sendReply(r, null, bodyPresent);
      settle({ outcome: r.error, status: r.status });
    };
    let done = false;
    client.onAbort(() => {
      if (done) return;
      done = true;
      settle({ outcome: 'client_aborted', status: 0 });
    });
    // The body and the policies' verdict, in whichever order they arrive.
    let text: string | null = bodyPresent ? null : '';
    let decided = verdict === null;
    const proceed = () => {
      if (done || text === null || !decided) return;
      done = true;
      this.#parsed(ex, client, text, wait, settle);
    };
    verdict?.then(
      (r) => {
        if (done) return;
        if (r !== null) {
          done = true;
          return stop(r);
        }
        decided = true;
        proceed();
      },
      (err: unknown) => {
        if (done) return;
        done = true;
        requestFailed(this.#opts.log, 'data plane policies stage failed', err, client, settle);
      },
    );
    if (onData === null) return proceed();
    const chunks: Buffer[] = [];
    let size = 0;
    onData((chunk, isLast) => {
      if (done) return;
      size += chunk.byteLength;
      if (limit.over(size)) {
        done = true;
        return stop(limit.reply);
      }
      if (chunk.byteLength > 0) chunks.push(chunk);
      if (isLast) {
        text = Buffer.concat(chunks, size).toString('utf8');
        proceed();
      }
    });
  }

  #parsed(ex: Exchange, client: ResponseEncoder, text: string, wait: number, settle: (s: Settlement) => void): void {
    const req = parseSqlRequest(text);
    if (typeof req === 'string') {
      client.sendReply(reply(400, 'bad_request', req), null, false);
      return settle({ outcome: 'bad_request', status: 400 });
    }
    // Async pools (spec rule 5), as on HTTP pools: a job when asked by header, when busy (async_on_queue),
    // or when the wait for a slot times out. The body is checked first: a job never holds a malformed query.
    const asyncPool = this.#asyncPool(ex);
    const fits = Buffer.byteLength(text) <= JOB_BODY_CAP;
    if (asyncPool && asyncRequested(ex.headers)) {
      if (!fits) {
        client.sendReply(JOB_TOO_LARGE, null, false);
        return settle({ outcome: JOB_TOO_LARGE.error, status: JOB_TOO_LARGE.status });
      }
      return this.#toJob(ex, client, text, 'requested', settle);
    }
    const a = admit(this.#opts.governor, ex, asyncPool?.asyncOnQueue ? 0 : wait, client);
    const after = (x: Admission) => {
      const reason = asyncPool && fits && !x.ok && !client.aborted ? jobReason(asyncPool, x.reason) : null;
      if (reason) return this.#toJob(ex, client, text, reason, settle);
      this.#admitted(ex, client, req, x).then(settle, (err: unknown) => {
        // #admitted resolves on every failure it knows; this is a bug, but the slot must still come back.
        requestFailed(this.#opts.log, 'SQL over HTTP failed unexpectedly', err, client, settle);
      });
    };
    if (a instanceof Promise) {
      a.then(after, (err: unknown) => {
        this.#opts.log.error({ err }, 'governor acquire failed');
        after({ ok: false, reason: 'unavailable', queuedMs: 0 });
      });
    } else after(a);
  }

  /** The request's pool when its requests may become jobs (async on, an active destination, jobs wired). */
  #asyncPool(ex: Exchange): PoolEntry | null {
    return this.#opts.jobs && asyncEligible(ex.pool!) ? ex.pool! : null;
  }

  /** Spills the SQL request as a job and answers 202; a job is counted by the jobs, not as a pool request. */
  #toJob(ex: Exchange, client: ResponseEncoder, text: string, reason: JobReason, settle: (s: Settlement) => void): void {
    ex.admission = null;
    spillAndAnswer(this.#opts.jobs!, ex, client, Buffer.from(text, 'utf8'), reason).then(settle, (err: unknown) => {
      requestFailed(this.#opts.log, 'accepting an async job failed', err, client, settle);
    });
  }

  async #admitted(ex: Exchange, client: ResponseEncoder, req: SqlRequest, a: Admission): Promise<Settlement> {
    const pool = ex.pool!;
    ex.admission = a;
    ex.queuedMs = a.queuedMs;
    ex.waited = a.queued === true;
    if (!a.ok) {
      if (a.reason === 'aborted' || client.aborted) return { outcome: 'client_aborted', status: 0 };
      const r = refusalReply(a, governorHeaders(this.#opts.governor, pool.id, a.queuedMs))!;
      client.sendReply(r, null, false);
      return { outcome: r.error, status: r.status };
    }
    ex.permit = a.permit;
    if (!client.open) return { outcome: 'client_aborted', status: 0 };

    const started = performance.now();
    const r = await this.upstreams.run(pool, statementsOf(req), {
      timeoutMs: pool.settings.requestTimeoutMs,
      // Cancels the query when the client leaves.
      signal: client.signal(),
      transaction: req.kind === 'batch',
    });
    ex.upstreamMs = performance.now() - started;
    if (!r.ok && r.failure.kind === 'aborted') return { outcome: 'client_aborted', status: 0, upstream: { dropped: true } };
    const { status, body } = r.ok ? { status: 200, body: responseJson(req, r.results) } : errorJson(r.failure as Exclude<DbFailure, { kind: 'aborted' }>, r.index);
    const headers = [['content-type', 'application/json'] as const, ...governorHeaders(this.#opts.governor, pool.id, ex.queuedMs)];
    const sent = sendJson(client, status, headers, Buffer.from(JSON.stringify(body)));
    if (!sent) return { outcome: 'client_aborted', status: 0, upstream: { status, latencyMs: ex.upstreamMs } };
    return settlementOf(r, status, ex.upstreamMs);
  }
}

/** The reason a refused admission becomes an async job instead of a refusal, or null (as on HTTP pools). */
function jobReason(pool: PoolEntry, refusal: string): JobReason | null {
  if (refusal === 'queue_timeout') return 'wait_timeout';
  if ((refusal === 'no_slot' || refusal === 'queue_full') && pool.asyncOnQueue) return 'busy';
  return null;
}

/**
 * Writes a whole JSON response; false when the client went away first. The encoder takes the body whole (what the
 * socket cannot take yet goes out as it drains), so the slot is not held for a slow reader.
 */
function sendJson(client: ResponseEncoder, status: number, headers: HeaderList, body: Buffer): boolean {
  if (!client.open) return false;
  client.encodeHeaders(status, headers, body.length);
  client.encodeData(body, true);
  return true;
}
