// The job runner (worker role): for each pool with ready jobs it takes governor slots, claims one job per
// slot (FOR UPDATE SKIP LOCKED, under a lease), forwards the stored request with the proxy's own
// forwarding code (or, on a database pool, runs the stored SQL body like the sync endpoint), and stores the result with its terminal status and outbox event in one transaction.
import { abortableOf, type Governor, type Permit } from '../governor/governor.js';
import type { Logger } from '../log.js';
import type { ForwardBuffered } from '../pool-request/buffered.js';
import type { PoolEntry, Snapshot } from '../pool-request/snapshot.js';
import type { Queryable, Sql } from '../store/sql.js';
import type { JobEvent } from './job-event.js';
import type { RunSqlJob } from './sql-job.js';
import type { SecretBox } from '../security/secret-box.js';
import {
  claimJob,
  expireJobs,
  finishClaimed,
  poolsWithReadyJobs,
  pruneFinished,
  recoverLapsed,
  retryLater,
  sweepDue,
  type ClaimedJob,
  type SweptJob,
} from './job-store.js';
import { JOB_RETENTION_MS, JOBS_CHANNEL, LEASE_MARGIN_MS, MAX_ATTEMPTS, RESULT_BODY_CAP, RETRY_BASE_MS, RUNNER_MAX_IN_FLIGHT, retryDelayMs } from './job-limits.js';
import { databaseDetail, httpDetail, resultUrl } from './result-view.js';
import { NextLook, sleepUntil } from '../store/next-look.js';

export type EnqueueJobEvent = (tx: Queryable, event: JobEvent) => Promise<number>;

/** What a sweep found: it failed, it had work (expired, recovered or pruned), and when the next thing is due (ms; null: no job; undefined: unknown). */
export interface SweepResult {
  failed: boolean;
  worked: boolean;
  nextInMs: number | null | undefined;
}

/**
 * The runner's fixed limits, as options so tests can use small ones (no 8 MiB rows, no seconds of real
 * backoff, a known jitter); the service runs with the defaults.
 */
export interface JobRunnerTuning {
  /** Largest stored result body (default RESULT_BODY_CAP, 8 MiB). */
  resultBodyCap?: number;
  /** First retry's backoff before jitter (default RETRY_BASE_MS, 1 s; then ×4 per attempt). */
  retryBaseMs?: number;
  /** The jitter's random source, in [0, 1) (default Math.random). */
  random?: () => number;
}

export interface JobRunnerOptions extends JobRunnerTuning {
  sql: Sql;
  /** Opens the stored request's sealed headers and body (job-store.ts). */
  box: SecretBox;
  governor: Governor;
  /** The current config snapshot (pools with their origin, credential and settings). */
  snapshot: () => Snapshot;
  /** Sends an HTTP pool's job to its origin (the data plane's forward stage, src/dataplane/forward.ts forwardBuffered). */
  forward: ForwardBuffered;
  /** Runs a database pool's job on that pool's connections (db/sql-over-http.ts runSqlRequest, with the data plane's connections when it shares the process). */
  runSql: RunSqlJob;
  /** Writes the job's event to the webhook outbox, in the caller's transaction. */
  enqueue: EnqueueJobEvent;
  log: Logger;
  poolDomain: string;
  /** Public address of the lock/pool API (poll and result URLs). */
  lockApiUrl: () => string;
  /**
   * This process holds the store alone (embedded store behind the data-dir lock): every `running` job
   * at start was left by a crashed run and is recovered at once instead of after its lease.
   */
  exclusiveStore: boolean;
  /**
   * How often the runner looks (scan for ready jobs, then the expiry, lease-recovery and retention sweep) while
   * something is going on or already due (default 1 s; the NOTIFY on spill is the fast path).
   */
  pollMs?: number;
  /**
   * The longest the runner sleeps when nothing is due: it looks again at the store's next due moment (a
   * retry's run_after, a TTL, a lease's end, a retention) or after this, whichever comes first. Default: one
   * minute on an exclusive store (every job is spilled and moved by this process, which wakes the runner),
   * pollMs on a shared one (another runner's retry or a crashed one's lapsing lease arrive unannounced).
   */
  idleMaxMs?: number;
}

export class JobRunner {
  readonly #o: JobRunnerOptions;
  #inFlight = 0;
  #started = 0;
  readonly #running = new Set<Promise<void>>();
  /** Pools being pumped, and pools asked to pump again when the current pump ends. */
  readonly #pumping = new Set<number>();
  readonly #again = new Set<number>();
  /** Pools with a runner waiter in the governor queue (at most one each). */
  readonly #waiting = new Map<number, AbortController>();
  #scanning: Promise<void> | null = null;
  #scanAgain = false;
  /** The next look (scan and sweep). */
  readonly #next = new NextLook(() => void this.#look());
  #looking: Promise<void> | null = null;
  #lookAgain = false;
  readonly #pollMs: number;
  readonly #idleMaxMs: number;
  #unlisten: (() => Promise<void>) | null = null;
  #closed = false;
  #sweeping: Promise<SweepResult> | null = null;
  #byId = new Map<number, PoolEntry>();
  #byIdOf: Snapshot | null = null;
  readonly #resultCap: number;
  readonly #retryBaseMs: number;
  readonly #random: () => number;

  constructor(opts: JobRunnerOptions) {
    this.#o = opts;
    this.#resultCap = opts.resultBodyCap ?? RESULT_BODY_CAP;
    this.#retryBaseMs = opts.retryBaseMs ?? RETRY_BASE_MS;
    this.#random = opts.random ?? Math.random;
    this.#pollMs = opts.pollMs ?? 1000;
    this.#idleMaxMs = opts.idleMaxMs ?? (opts.exclusiveStore ? 60_000 : this.#pollMs);
  }

  /**
   * Recovers what a crashed run left, then follows NOTIFY and looks on a timer: every pollMs while something is
   * going on, and when nothing is, at the store's next due moment (at most idleMaxMs away). An idle runner on
   * the embedded store thus runs no statement at all between due moments, where it used to run three a second
   * on the data plane's event loop.
   */
  async start(): Promise<void> {
    const due = await this.sweep(this.#o.exclusiveStore);
    this.#unlisten = await this.#o.sql.listen(JOBS_CHANNEL, (payload) => {
      this.wake(Number(payload));
      // A new job: its TTL (and, if it cannot run now, its turn) is looked after from the next look on.
      this.#next.in(this.#pollMs);
    });
    this.wake();
    this.#next.in(this.#sleepFor(due));
  }

  /** Jobs running now. */
  get inFlight(): number {
    return this.#inFlight;
  }

  /** Job runs this runner has started (attempts, including retries). */
  get started(): number {
    return this.#started;
  }

  /** Looks for work: for one pool, or (no argument) every pool with ready jobs. */
  wake(poolId?: number): void {
    if (this.#closed) return;
    if (poolId !== undefined && Number.isInteger(poolId) && poolId > 0) {
      void this.#pump(poolId);
      return;
    }
    if (this.#scanning) {
      this.#scanAgain = true;
      return;
    }
    this.#scanning = (async () => {
      try {
        do {
          this.#scanAgain = false;
          const pools = await poolsWithReadyJobs(this.#o.sql);
          for (const id of pools) void this.#pump(id);
        } while (this.#scanAgain && !this.#closed);
      } catch (err) {
        this.#o.log.error({ err }, 'job scan failed; retried on the next tick');
        this.#next.in(this.#pollMs);
      } finally {
        this.#scanning = null;
      }
    })();
  }

  /** How long to sleep after a sweep: pollMs while something is due or went wrong, else until the next due moment. */
  #sleepFor(due: SweepResult): number {
    if (due.failed || due.worked || due.nextInMs === undefined) return this.#pollMs;
    if (due.nextInMs === null) return this.#idleMaxMs;
    if (due.nextInMs <= 0) return this.#pollMs;
    return sleepUntil(due.nextInMs, this.#idleMaxMs);
  }

  /**
   * One look: a scan for ready jobs, then the sweep, which says when to look next. One look at a time; a look
   * asked for meanwhile (its moment came while this one ran) runs when this one ends, with what it finds then.
   */
  async #look(): Promise<void> {
    if (this.#closed) return;
    if (this.#looking) {
      this.#lookAgain = true;
      return;
    }
    const run = (async () => {
      let due: SweepResult;
      do {
        this.#lookAgain = false;
        this.wake();
        await this.#scanning;
        // One sweep at a time: a slow store must not stack them up.
        this.#sweeping ??= this.sweep(false).finally(() => (this.#sweeping = null));
        due = await this.#sweeping;
      } while (this.#lookAgain && !this.#closed);
      this.#next.in(this.#sleepFor(due));
    })();
    this.#looking = run.finally(() => (this.#looking = null));
    await this.#looking;
  }

  /**
   * Expires queued jobs past their TTL and recovers lapsed leases, each with its events; prunes old finished jobs.
   * Says whether it did anything and how long until the next due moment.
   */
  async sweep(recoverAll: boolean): Promise<SweepResult> {
    try {
      // Probe first: the writes only when something is actually due.
      const due = await sweepDue(this.#o.sql, recoverAll, JOB_RETENTION_MS);
      const worked = due.lapsed || due.prune;
      while (due.lapsed) {
        const swept = await this.#o.sql.transaction(async (tx) => {
          const expired = await expireJobs(tx, 200);
          const { requeued, failed } = await recoverLapsed(tx, MAX_ATTEMPTS, recoverAll, 500);
          for (const j of [...expired, ...failed]) await this.#o.enqueue(tx, this.#sweptEvent(j));
          return expired.length + failed.length + requeued;
        });
        if (swept === 0 || this.#closed) break;
        this.wake();
      }
      if (due.prune) await pruneFinished(this.#o.sql, JOB_RETENTION_MS, 500);
      return { failed: false, worked, nextInMs: due.nextInMs };
    } catch (err) {
      this.#o.log.error({ err }, 'job sweep failed; retried on the next tick');
      return { failed: true, worked: false, nextInMs: undefined };
    }
  }

  #sweptEvent(j: SweptJob): JobEvent {
    return {
      jobId: j.id,
      poolId: j.poolId,
      poolHost: `${j.subdomain}.${this.#o.poolDomain}`,
      status: j.status,
      reason: j.reason,
      createdAt: j.createdAt,
      completedAt: j.completedAt,
    };
  }

  /** A pool that can run jobs now: active, http with an origin or database with its role. Others keep their jobs until TTL. */
  #pool(poolId: number): PoolEntry | null {
    const snapshot = this.#o.snapshot();
    if (snapshot !== this.#byIdOf) {
      // The snapshot is keyed by subdomain; index it by id once per snapshot.
      this.#byId = new Map([...snapshot.pools.values()].map((p) => [p.id, p]));
      this.#byIdOf = snapshot;
    }
    const p = this.#byId.get(poolId);
    if (!p || p.status !== 'active') return null;
    if (p.backend === 'http') return p.origin !== null ? p : null;
    return p.database !== null && p.credential?.method === 'postgres_role' ? p : null;
  }

  /** Takes free slots of the pool and starts one claimed job per slot, until slots or jobs run out. */
  async #pump(poolId: number): Promise<void> {
    if (this.#pumping.has(poolId)) {
      this.#again.add(poolId);
      return;
    }
    this.#pumping.add(poolId);
    try {
      do {
        this.#again.delete(poolId);
        // A wake that arrives while this pump runs (a job spilled meanwhile) makes it look once more.
        while (!this.#closed && this.#inFlight < RUNNER_MAX_IN_FLIGHT) {
          const pool = this.#pool(poolId);
          if (!pool) break;
          let a;
          try {
            a = this.#o.governor.acquire({ poolId, waitMs: 0 });
          } catch (err) {
            this.#o.log.error({ err, poolId }, 'governor acquire failed for a job');
            break;
          }
          if (a instanceof Promise) a = await a;
          if (!a.ok) {
            // No free slot: stand in the pool's queue like a sync caller, so jobs get their FIFO turn.
            this.#queueFor(pool);
            break;
          }
          if (!(await this.#claimAndStart(pool, a.permit))) break;
        }
      } while (this.#again.has(poolId) && !this.#closed);
    } finally {
      this.#pumping.delete(poolId);
    }
  }

  /** One waiter per pool in the governor queue; a grant claims a job and pumps again. */
  #queueFor(pool: PoolEntry): void {
    if (this.#waiting.has(pool.id) || this.#closed) return;
    const abort = new AbortController();
    this.#waiting.set(pool.id, abort);
    void (async () => {
      try {
        const a = await this.#o.governor.acquire({ poolId: pool.id, waitMs: pool.settings.queueTimeoutMs, abortable: abortableOf(abort.signal) });
        this.#waiting.delete(pool.id);
        if (!a.ok) return;
        if (this.#closed) {
          a.permit.release({ dropped: true });
          return;
        }
        if (await this.#claimAndStart(pool, a.permit)) void this.#pump(pool.id);
      } catch (err) {
        this.#waiting.delete(pool.id);
        this.#o.log.error({ err, poolId: pool.id }, 'governor wait failed for a job');
      }
    })();
  }

  /** Claims the pool's next job for the permit and runs it; false (permit released) when there is none. */
  async #claimAndStart(pool: PoolEntry, permit: Permit): Promise<boolean> {
    let job: ClaimedJob | null;
    try {
      job = await claimJob(this.#o.sql, this.#o.box, pool.id, pool.settings.requestTimeoutMs + LEASE_MARGIN_MS);
    } catch (err) {
      this.#o.log.error({ err, poolId: pool.id }, 'job claim failed');
      job = null;
    }
    if (!job) {
      permit.release({ dropped: true });
      return false;
    }
    this.#inFlight++;
    this.#started++;
    const run = this.#run(pool, job, permit).finally(() => {
      this.#inFlight--;
      this.#running.delete(run);
      // A slot came back: the pool may have more jobs.
      if (!this.#closed) void this.#pump(pool.id);
    });
    this.#running.add(run);
    return true;
  }

  async #run(pool: PoolEntry, job: ClaimedJob, permit: Permit): Promise<void> {
    if (pool.backend !== 'http') return this.#runSql(pool, job, permit);
    const r = await this.#o.forward(pool, job.request, this.#resultCap);
    permit.release(r.upstream);
    await this.#storeOutcome(job, async () => {
      if (r.ok) {
        await this.#o.sql.transaction(async (tx) => {
          const done = await finishClaimed(tx, job, 'completed', r.response, null);
          if (!done) return; // The lease lapsed and the job was taken again: that run reports it.
          await this.#o.enqueue(tx, {
            ...this.#event(pool, job, 'completed', done.completedAt),
            detail: httpDetail(r.response, resultUrl(this.#o.lockApiUrl(), pool.subdomain, job.id)),
          });
        });
      } else if (r.retryable && job.attempts < MAX_ATTEMPTS) {
        await this.#retryLater(job, r.error);
      } else {
        await this.#o.sql.transaction(async (tx) => {
          const done = await finishClaimed(tx, job, 'failed', null, r.error);
          if (done) await this.#o.enqueue(tx, this.#event(pool, job, 'failed', done.completedAt));
        });
      }
    });
  }

  /**
   * Writes a run's outcome, retrying while the store is away (a PostgreSQL restart, a failover) for as long as
   * the job's lease surely lasts: its answer is already in hand, and dropping it would run the request at the
   * origin again. Each write is conditional on the claim (finishClaimed), so a retry can never overwrite a later
   * run. Past the margin, or when the runner closes, the lease lapses and the job runs again (at-least-once).
   */
  async #storeOutcome(job: ClaimedJob, write: () => Promise<void>): Promise<void> {
    const giveUpAt = performance.now() + LEASE_MARGIN_MS - 1000;
    for (let delay = 100, attempt = 1; ; attempt++, delay = Math.min(delay * 2, 2000)) {
      try {
        await write();
        if (attempt > 1) this.#o.log.info({ jobId: job.id, attempts: attempt }, 'job result stored once the store answered again');
        return;
      } catch (err) {
        if (this.#closed || performance.now() + delay >= giveUpAt) {
          this.#o.log.error({ err, jobId: job.id }, 'storing a job result failed; the job will be recovered after its lease');
          return;
        }
        if (attempt === 1) this.#o.log.warn({ err, jobId: job.id }, 'storing a job result failed; retrying while its lease lasts');
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }

  /**
   * A database pool's job: the stored body is run as the sync endpoint runs it. The database answered when
   * it returned rows or a database error (both complete the job, the error in the detail); connection
   * trouble and timeouts are retried like an origin that did not answer, then the job fails.
   */
  async #runSql(pool: PoolEntry, job: ClaimedJob, permit: Permit): Promise<void> {
    const started = performance.now();
    const r = await this.#o.runSql(pool, job.request.body ?? Buffer.alloc(0));
    const latencyMs = performance.now() - started;
    const answered = r.ok || r.body.error === 'database_error';
    permit.release(answered ? { status: r.status, latencyMs } : { dropped: true, latencyMs });
    await this.#storeOutcome(job, async () => {
      if (answered) {
        let answer: Record<string, unknown>;
        if (r.ok) {
          const { kind: _kind, ...rest } = r.detail;
          answer = rest;
        } else answer = r.body;
        const json = Buffer.from(JSON.stringify(answer));
        // Over the result cap the JSON is cut like an origin body (no longer parseable: it is marked truncated).
        const truncated = json.length > this.#resultCap;
        const result = { status: r.status, headers: { 'content-type': 'application/json' }, body: truncated ? json.subarray(0, this.#resultCap) : json, truncated };
        await this.#o.sql.transaction(async (tx) => {
          const done = await finishClaimed(tx, job, 'completed', result, null);
          if (!done) return; // The lease lapsed and the job was taken again: that run reports it.
          await this.#o.enqueue(tx, {
            ...this.#event(pool, job, 'completed', done.completedAt),
            detail: databaseDetail(r.status, answer, json.length, truncated, resultUrl(this.#o.lockApiUrl(), pool.subdomain, job.id)),
          });
        });
        return;
      }
      const error = typeof r.body.message === 'string' ? r.body.message : String(r.body.error);
      // A stored body that does not parse (400) would fail the same way on every attempt.
      if (r.status !== 400 && job.attempts < MAX_ATTEMPTS) {
        await this.#retryLater(job, error);
        return;
      }
      await this.#o.sql.transaction(async (tx) => {
        const done = await finishClaimed(tx, job, 'failed', null, error);
        if (done) await this.#o.enqueue(tx, this.#event(pool, job, 'failed', done.completedAt));
      });
    });
  }

  /** Puts the job back with its backoff, and looks again when its turn comes (nothing else would announce it). */
  async #retryLater(job: ClaimedJob, error: string): Promise<void> {
    const delayMs = retryDelayMs(job.attempts, this.#retryBaseMs, this.#random);
    if (await retryLater(this.#o.sql, job, delayMs, error)) this.#next.in(sleepUntil(delayMs, Infinity));
  }

  #event(pool: PoolEntry, job: ClaimedJob, status: 'completed' | 'failed', completedAt: number): JobEvent {
    return {
      jobId: job.id,
      poolId: pool.id,
      poolHost: `${pool.subdomain}.${this.#o.poolDomain}`,
      status,
      reason: job.reason,
      createdAt: job.createdAt,
      completedAt,
    };
  }

  /** Stops taking jobs and lets running ones finish (their leases cover them if the process dies). */
  async close(): Promise<void> {
    this.#closed = true;
    this.#next.close();
    for (const a of this.#waiting.values()) a.abort();
    await this.#unlisten?.().catch(() => {});
    await this.#scanning?.catch(() => {});
    await this.#looking;
    await this.#sweeping;
    await Promise.allSettled([...this.#running]);
  }
}
