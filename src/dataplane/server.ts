// The proxy port's request handler behind its front door (node:http: node-door.ts; uWS: src/http/uws/), running
// the stage chain of the request's backend, each chain built once here (Envoy's filter chain): route, then for an
// HTTP pool authenticate → scope → policies → the 413 rule → the wait → the async check, ending in admit →
// forward → release; for a database pool the same with the SQL target check after the policies, ending in SQL
// over HTTP.
import type { Config } from '../config/schema.js';
import type { Admission, Governor } from '../governor/governor.js';
import { UwsDoor } from '../http/uws/door.js';
import { NodeDoor } from './node-door.js';
import type { Logger } from '../log.js';
import type { SecretBox } from '../security/secret-box.js';
import { systemLookup, type Lookup } from '../security/targets.js';
import type { Sql } from '../store/sql.js';
import { AccessLog } from '../pool-request/access-log.js';
import { refusalReply, governorHeaders } from '../pool-request/refusal.js';
import { BodyLimit, bodyLimitStage } from '../pool-request/body-limit.js';
import { admit, queueWaitStage } from '../pool-request/admit.js';
import { authenticateStage } from '../pool-request/authenticate.js';
import { hasBody, type BodySource, type DoorHandler, type FrontDoor, type ResponseEncoder } from '../pool-request/codec.js';
import { reply, type Exchange, type Reply, type Stage } from '../pool-request/exchange.js';
import { forward, Upstreams, type ForwardDeps } from './forward.js';
import { releaseStage, type DataplaneMetrics, type Settlement } from '../pool-request/release.js';
import { requestFailed } from '../pool-request/request-failed.js';
import { BodyTimeoutError, RequestBody } from '../pool-request/request-body.js';
import { BodyTooLargeError } from '../pool-request/body-limit.js';
import { framingRefusal } from './framing.js';
import { acceptJob, asyncEligible, asyncRequested, tooLargeForJob, type JobIntake } from '../jobs/job-intake.js';
import { asyncSizeStage } from '../jobs/async-stage.js';
import type { JobReason } from '../jobs/job-event.js';
import { routeStage } from './route.js';
import { formOverrideRefusal, needsFormJudgement, scopeStage } from './scope.js';
import { type KeyChange, type PoolEntry, type Snapshot, type SnapshotFeed } from '../pool-request/snapshot.js';
import { poolLimits, SnapshotSource } from './snapshot-source.js';
import { Policies } from '../policies/index.js';
import type { NonceStore } from '../policies/nonce-store.js';
import { policiesStage } from '../policies/dataplane-stage.js';
import { SqlOverHttp, sqlTargetStage } from '../db/sql-over-http.js';
import type { DbUpstreams } from '../db/upstream.js';
import { proxyHttpParser, UWS_LIMITS } from './http-parser.js';
import { dataplaneThreadCount } from './threads/host.js';

export interface DataplaneOptions {
  config: Config;
  /** The store the snapshot is loaded from; not needed with `feed`. */
  sql?: Sql;
  box?: SecretBox;
  /** A worker thread's snapshot, pushed by the main thread (src/dataplane/threads), instead of loading it from the store. */
  feed?: (onLoad: (snapshot: Snapshot) => void) => SnapshotFeed;
  /** false: no pool listener here (worker threads listen instead); default true. */
  listen?: boolean;
  /** The port to listen on instead of config.proxyPort (each worker thread is told its own). */
  port?: number;
  log: Logger;
  governor: Governor;
  metrics?: DataplaneMetrics | null;
  /** Unix ms; key expiry is checked against it. */
  clock?: () => number;
  /** How long close() lets in-flight requests finish before cutting them. */
  drainMs?: number;
  /** Async jobs: where requests of async pools are spilled; null serves every request synchronously. */
  jobs?: JobIntake | null;
  /** The resolver the SSRF guard re-checks origin and JWKS connections with (tests map names). */
  lookup?: Lookup;
  /** Where HMAC nonces are remembered: Redis's with redisUrl (the role passes it), the main thread's in a thread; default in memory. */
  nonces?: NonceStore;
}

const BAD_TARGET = reply(400, 'bad_request', 'the request target must be a path');
/** RFC 9112 §3.2: a request with more than one Host (or a list in one) is answered 400, and the connection closed. */
const TWO_HOSTS = reply(400, 'bad_request', 'a request must carry exactly one Host header');
/**
 * Bytes of a request body read before the request takes a slot (issue 25 item 4): a small body is then whole
 * before the origin sees anything (nginx reads the whole body before it connects upstream), and a client that
 * declares a body and goes silent holds no slot. A larger body is streamed once this much has arrived.
 */
export const PREREAD_BYTES = 64 * 1024;
const FORM_TOO_LARGE = reply(
  413,
  'payload_too_large',
  `a read key's form body is judged for a _method field before it is forwarded, and may be at most ${PREREAD_BYTES} bytes`,
);

/** The stages a request on one backend runs after route, and the end that then takes the request over. */
interface Chain {
  readonly stages: readonly Stage[];
  /** Answers and settles the request itself (synchronously registers its body reader). */
  readonly end: (ex: Exchange, client: ResponseEncoder) => void;
}

/** Told about every snapshot the data plane loads and every key point update (the thread host forwards them). */
export interface SnapshotListener {
  loaded(snapshot: Snapshot): void;
  keys(changes: readonly KeyChange[]): void;
}

export class Dataplane {
  readonly governor: Governor;
  readonly snapshots: SnapshotFeed;
  /** Stage 4's compiled per-pool policies, shared with the lock API (policiesGate). */
  readonly policies: Policies;
  #port = 0;
  readonly #opts: DataplaneOptions;
  /** The pool listener: node:http, or the uWS door with proxyHttpParser 'uws' (docs/http-front-door.md). */
  readonly #door: FrontDoor;
  /** What the door hands each request to. */
  readonly #doorHandler: DoorHandler = {
    serve: (ex, body, client) => {
      this.#inFlight++;
      try {
        this.#begin(body, ex, client);
      } catch (err) {
        // A bug must cost one request, not the process (an exception escaping a uWS handler is fatal).
        this.#failed(ex, client, 'data plane request handler failed', err);
      }
    },
    refuse: (ex, client, r) => {
      this.#inFlight++;
      client.sendReply(r, null, true);
      this.#settle(ex, { outcome: r.error, status: r.status });
    },
  };
  /** Stage 1: finds the pool, and with it the backend whose chain runs next. */
  readonly #route: Stage;
  readonly #httpChain: Chain;
  readonly #sqlChain: Chain;
  readonly #upstreams: Upstreams;
  readonly #forwardDeps: ForwardDeps;
  /** Stage 7 for a forwarded request (one function for all of them). */
  readonly #forwarded = (ex: Exchange, s: Settlement): void => this.#settle(ex, s);
  readonly #accessLog: AccessLog;
  readonly #release: ReturnType<typeof releaseStage>;
  /** The 413 rule for HTTP pools (proxyBodyLimit; null: none). */
  readonly #bodyLimit: BodyLimit | null;
  /** SQL over HTTP: serves every database pool (postgres, mysql) after stage 4. */
  readonly #sql: SqlOverHttp;
  #inFlight = 0;
  #drained: (() => void) | null = null;
  #closing: Promise<void> | null = null;
  #listener: SnapshotListener | null = null;

  private constructor(opts: DataplaneOptions) {
    const clock = opts.clock ?? Date.now;
    this.#opts = opts;
    this.governor = opts.governor;
    const proxyLimit = opts.config.proxyBodyLimit;
    this.#bodyLimit = proxyLimit > 0 ? new BodyLimit(proxyLimit, `request body exceeds ${proxyLimit} bytes (the operator sets it: POOLGATE_PROXY_BODY_LIMIT)`) : null;
    const trustedProxies = opts.config.trustedProxies.split(',').map((c) => c.trim()).filter(Boolean);
    const targets = { allowPrivate: opts.config.allowPrivateTargets, lookup: opts.lookup ?? systemLookup };
    this.#upstreams = new Upstreams({ caFile: opts.config.originCaFile, targets, trustedProxies });
    this.#forwardDeps = { upstreams: this.#upstreams, governor: opts.governor };
    this.#accessLog = new AccessLog({ file: opts.config.accessLogFile, sample: opts.config.accessLogSample });
    this.#release = releaseStage(opts.metrics ?? null, this.#accessLog);
    this.#route = routeStage(opts.config.poolDomain);
    this.policies = new Policies({
      config: { trustedProxies },
      clock,
      targets,
      onRefusal: (pool, policy, reason) => opts.metrics?.policyRefused?.(pool, policy, reason),
      nonces: opts.nonces,
    });
    this.#sql = new SqlOverHttp({ config: opts.config, governor: opts.governor, log: opts.log, jobs: opts.jobs ?? null });
    // The chains: nothing in them depends on the snapshot (a pool's policies are compiled per pool settings
    // by Policies and cached there), so each is built once, from the config. A stage that cannot apply here
    // (no body limit, no job intake) is left out rather than checked per request.
    const head: Stage[] = [authenticateStage(clock), scopeStage(), policiesStage(this.policies)];
    const jobStages: Stage[] = opts.jobs ? [asyncSizeStage] : [];
    this.#httpChain = {
      stages: [...head, ...(this.#bodyLimit ? [bodyLimitStage(this.#bodyLimit)] : []), queueWaitStage, ...jobStages],
      end: (ex, client) => this.#forwardEnd(ex, client),
    };
    this.#sqlChain = {
      stages: [...head, sqlTargetStage, bodyLimitStage(this.#sql.bodyLimit), queueWaitStage, ...jobStages],
      end: (ex, client) => this.#sql.serve(ex, client, (s) => this.#settle(ex, s)),
    };
    const onLoad = (s: Snapshot) => {
      this.governor.configure(poolLimits(s), s.budgets);
      this.#sql.sync(s);
    };
    if (opts.feed) {
      this.snapshots = opts.feed(onLoad);
    } else {
      if (!opts.sql || !opts.box) throw new Error('the data plane needs the store (sql, box) or a snapshot feed');
      this.snapshots = new SnapshotSource({
        sql: opts.sql,
        box: opts.box,
        log: opts.log,
        clock,
        resyncMs: opts.config.snapshotResyncMs,
        onLoad: (s) => {
          onLoad(s);
          this.#listener?.loaded(s);
        },
        onKeys: (changes) => this.#listener?.keys(changes),
      });
    }
    // The proxy port's front door: node:http (first-class), or the uWS adapter where chosen (docs/http-front-door.md).
    const snapshot = () => this.snapshots.current;
    this.#door = proxyHttpParser(opts.config) === 'node' ? new NodeDoor(this.#doorHandler, snapshot) : new UwsDoor(this.#doorHandler, snapshot);
  }

  /** Loads the snapshot, then listens on config.proxyPort. */
  static async start(opts: DataplaneOptions): Promise<Dataplane> {
    const dp = new Dataplane(opts);
    await dp.snapshots.start();
    try {
      if (opts.listen !== false) await dp.#listen(opts.config.host, opts.port ?? opts.config.proxyPort);
      // Threads (fed by the main thread) are warned for once, by their host.
      if (opts.listen !== false && !opts.feed && proxyHttpParser(opts.config) === 'uws') opts.log.warn({ proxyHttpParser: 'uws' }, UWS_LIMITS);
    } catch (err) {
      await dp.snapshots.close();
      await dp.#upstreams.close(true);
      throw err;
    }
    return dp;
  }

  get port(): number {
    return this.#port;
  }

  /** Forwards each later snapshot and key update to `listener` (one listener: the thread host). */
  followSnapshots(listener: SnapshotListener | null): void {
    this.#listener = listener;
  }

  /** The pool access log, shared with the lock API (its acquire attempts belong in the same log). */
  get accessLog(): AccessLog {
    return this.#accessLog;
  }

  /** The upstream database connections (for the async jobs runner: src/db/sql-over-http.ts runSqlRequest). */
  get databases(): DbUpstreams {
    return this.#sql.upstreams;
  }

  /** Requests between arrival and release. */
  get inFlight(): number {
    return this.#inFlight;
  }

  async #listen(host: string, port: number): Promise<void> {
    // Threads sharing the proxy port each bind it with SO_REUSEPORT; the kernel spreads connections over them.
    const reusePort = dataplaneThreadCount(this.#opts.config) > 1 && this.#opts.config.dataplaneThreadPorts === 'shared';
    this.#port = await this.#door.listen(host, port, reusePort);
  }

  /** A bug or an unexpected failure: this request gets 500 and is settled (src/pool-request/request-failed.ts). */
  #failed(ex: Exchange, client: ResponseEncoder, what: string, err: unknown): void {
    requestFailed(this.#opts.log, what, err, client, (st) => this.#settle(ex, st));
  }

  /** Runs route, then the chain of the pool's backend; returns once everything async is under way. */
  #begin(onBody: BodySource | null, ex: Exchange, client: ResponseEncoder): void {
    const framing = framingRefusal(ex.headers);
    if (framing !== null) return this.#refuseFraming(ex, client, framing);
    const host = ex.headers.host;
    if (host !== undefined && host.includes(',')) {
      client.sendReply(TWO_HOSTS, null, true);
      return this.#settle(ex, { outcome: TWO_HOSTS.error, status: TWO_HOSTS.status });
    }
    // Not origin-form (absolute-form, authority-form, `*`): answered and closed, like any request we cannot frame a meaning for.
    if (ex.path.charCodeAt(0) !== 47 /* '/' */) {
      client.sendReply(BAD_TARGET, null, true);
      return this.#settle(ex, { outcome: BAD_TARGET.error, status: BAD_TARGET.status });
    }
    if (onBody !== null && hasBody(ex.headers)) ex.body = onBody;
    let r = this.#route(ex);
    if (r !== null) return this.#stop(ex, client, r);
    const chain = ex.pool!.backend === 'http' ? this.#httpChain : this.#sqlChain;
    const stages = chain.stages;
    for (let i = 0; i < stages.length; i++) {
      r = stages[i]!(ex);
      if (r !== null) return this.#stop(ex, client, r);
    }
    chain.end(ex, client);
  }

  /** A stage's refusal. It leaves any request body unread: that connection is closed rather than the body parsed. */
  #stop(ex: Exchange, client: ResponseEncoder, r: Reply): void {
    // uWS would parse what follows the unread body as a request of its own: answered on the next turn instead.
    if (ex.body !== null && this.#door.answersUnreadBodyLater) return this.#refuseFraming(ex, client, r);
    client.sendReply(r, null, ex.body !== null);
    this.#settle(ex, { outcome: r.error, status: r.status });
  }

  /** The end of an HTTP pool's chain: the body stream, then (after a pending policies verdict) admit on. */
  #forwardEnd(ex: Exchange, client: ResponseEncoder): void {
    // Async pools (spec rule 5): a job when asked by header, when busy (async_on_queue), or after the wait.
    const asyncPool = this.#opts.jobs && asyncEligible(ex.pool!) ? ex.pool! : null;
    const judged = ex.body !== null && needsFormJudgement(ex);
    const body = ex.body !== null ? new RequestBody(client, ex.body, this.#bodyLimit, this.#opts.config.proxyBodyTimeoutMs, judged) : null;
    if (ex.verdict !== null) return this.#afterPolicies(ex.verdict, ex, client, body, () => this.#readFirst(ex, client, body, judged, asyncPool));
    this.#readFirst(ex, client, body, judged, asyncPool);
  }

  /**
   * The first PREREAD_BYTES of the body (all of a smaller one) arrive before the request goes on to a slot: a body
   * that stalls or breaks off there costs no slot and never reaches the origin (issue 25 items 4, 5). A read key's
   * form body is read whole and judged for `_method` (scope.ts).
   */
  #readFirst(ex: Exchange, client: ResponseEncoder, body: RequestBody | null, judged: boolean, asyncPool: PoolEntry | null): void {
    if (body === null) return this.#admitStage(ex, client, body, ex.waitMs, asyncPool);
    let waiting = true;
    client.onAbort(() => {
      if (!waiting) return;
      waiting = false;
      body.destroy();
      this.#settle(ex, { outcome: 'client_aborted', status: 0 });
    });
    body.whenReceived(PREREAD_BYTES, (err) => {
      if (!waiting || ex.settled) return;
      waiting = false;
      if (err !== null || (judged && !body.complete)) {
        const r =
          err instanceof BodyTooLargeError ? err.limit.reply
          : err instanceof BodyTimeoutError ? BodyTimeoutError.reply
          : err === null ? FORM_TOO_LARGE
          : null;
        if (r === null) return this.#settle(ex, { outcome: 'client_aborted', status: 0 });
        body.release();
        client.sendReply(r, null, true);
        return this.#settle(ex, { outcome: r.error, status: r.status });
      }
      const refused = judged ? formOverrideRefusal(ex, body.kept()) : null;
      if (refused !== null) {
        // The body was read whole: the connection can go on.
        client.sendReply(refused, null, false);
        return this.#settle(ex, { outcome: refused.error, status: refused.status });
      }
      try {
        this.#admitStage(ex, client, body, ex.waitMs, asyncPool);
      } catch (err) {
        this.#failed(ex, client, 'data plane request handler failed', err);
      }
    });
  }

  /**
   * A request whose body length is ambiguous is answered on the next turn, not now: uWS 20.30 goes on parsing
   * the rest of the read after a synchronous answer (even one that says close), so bytes smuggled behind the
   * body would become a request of their own. Answered later, the response is pending when uWS meets those
   * bytes, and uWS closes the connection instead (nothing more is parsed, nothing reaches the origin).
   */
  #refuseFraming(ex: Exchange, client: ResponseEncoder, r: Reply): void {
    client.onAbort(() => this.#settle(ex, { outcome: 'client_aborted', status: 0 }));
    setImmediate(() => {
      if (!client.open) return;
      client.sendReply(r, null, true);
      this.#settle(ex, { outcome: r.error, status: r.status });
    });
  }

  /** Waits for an async policy verdict (JWT, signed body, Redis nonces), then refuses or goes on. */
  #afterPolicies(pending: Promise<Reply | null>, ex: Exchange, client: ResponseEncoder, body: RequestBody | null, go: () => void): void {
    let deciding = true;
    client.onAbort(() => {
      if (deciding) this.#settle(ex, { outcome: 'client_aborted', status: 0 });
    });
    pending
      .then((r) => {
        deciding = false;
        if (ex.settled || !client.open) return;
        if (r === null) return go();
        body?.release();
        client.sendReply(r, null, body !== null && !body.complete);
        this.#settle(ex, { outcome: r.error, status: r.status });
      })
      .catch((err: unknown) => {
        deciding = false;
        this.#failed(ex, client, 'data plane policies stage failed', err);
      });
  }

  /** Stage 5 on: a job when the request asks for one, else a slot. */
  #admitStage(ex: Exchange, client: ResponseEncoder, body: RequestBody | null, wait: number, asyncPool: PoolEntry | null): void {
    if (asyncPool && asyncRequested(ex.headers)) return this.#toJob(ex, client, body, 'requested');
    const a = admit(this.governor, ex, asyncPool?.asyncOnQueue ? 0 : wait, client);
    if (a instanceof Promise) {
      const after = (x: Admission) => {
        try {
          this.#admitted(ex, client, body, x);
        } catch (err) {
          this.#failed(ex, client, 'data plane request handler failed', err);
        }
      };
      a.then(after, (err: unknown) => {
        this.#opts.log.error({ err }, 'governor acquire failed');
        after({ ok: false, reason: 'unavailable', queuedMs: 0 });
      });
    } else {
      this.#admitted(ex, client, body, a);
    }
  }

  #admitted(ex: Exchange, client: ResponseEncoder, body: RequestBody | null, a: Admission): void {
    ex.admission = a;
    ex.queuedMs = a.queuedMs;
    // Queued only when the governor really put it in its queue (a promise alone is not a wait: see Admission).
    ex.waited = a.queued === true;
    if (!a.ok) {
      if (a.reason === 'aborted' || client.aborted) {
        this.#settle(ex, { outcome: 'client_aborted', status: 0 });
        return;
      }
      const jobReason = this.#jobReason(ex, a.reason);
      if (jobReason) return this.#toJob(ex, client, body, jobReason);
      const r = refusalReply(a, governorHeaders(this.governor, ex.pool!.id, a.queuedMs))!;
      body?.release();
      client.sendReply(r, null, body !== null && !body.complete);
      this.#settle(ex, { outcome: r.error, status: r.status });
      return;
    }
    ex.permit = a.permit;
    if (!client.open) {
      this.#settle(ex, { outcome: 'client_aborted', status: 0 });
      return;
    }
    // A throw from here reaches #handle's or the queued path's catch, which answers 500 and settles.
    forward(this.#forwardDeps, ex, client, body, this.#forwarded);
  }

  /** The reason a refused request becomes an async job instead of a refusal, or null. */
  #jobReason(ex: Exchange, refusal: string): JobReason | null {
    const pool = ex.pool!;
    if (!this.#opts.jobs || !asyncEligible(pool) || tooLargeForJob(ex.headers)) return null;
    if (refusal === 'queue_timeout') return 'wait_timeout';
    if ((refusal === 'no_slot' || refusal === 'queue_full') && pool.asyncOnQueue) return 'busy';
    return null;
  }

  /** Spills the request as a job and answers 202 (src/jobs/job-intake.ts). */
  #toJob(ex: Exchange, client: ResponseEncoder, body: RequestBody | null, reason: JobReason): void {
    // A job is counted by the jobs, not as a refused pool request.
    ex.admission = null;
    acceptJob(this.#opts.jobs!, ex, client, body, reason).then(
      (s) => this.#settle(ex, s),
      (err: unknown) => {
        this.#failed(ex, client, 'accepting an async job failed', err);
      },
    );
  }

  /** Stage 7 for every path, exactly once per request. */
  #settle(ex: Exchange, s: Settlement): void {
    if (ex.settled) return;
    ex.settled = true;
    try {
      this.#release(ex, ex.permit, s);
    } catch (err) {
      this.#opts.log.error({ err }, 'release failed');
    }
    ex.permit = null;
    this.#inFlight--;
    if (this.#inFlight === 0 && this.#drained) this.#drained();
  }

  /** Stops accepting, lets in-flight requests finish (up to drainMs), then closes every connection. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#door.stopListening();
      await this.snapshots.close();
      if (this.#inFlight > 0) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, this.#opts.drainMs ?? 10_000);
          this.#drained = () => {
            clearTimeout(timer);
            resolve();
          };
        });
      }
      // Drops idle keep-alive connections too (present at runtime, missing from the typings).
      this.#door.closeConnections();
      await this.#upstreams.close(this.#inFlight > 0);
      await this.#sql.close();
      await this.policies.close();
      await this.#accessLog.close();
    })();
    return this.#closing;
  }
}
