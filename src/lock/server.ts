// The lock API listener (node:http, on config.lockPort): acquire, renew and release a pool's concurrency slot
// without proxying. It runs the data plane's stages 1–5 and 7 with the caller in between: the pool from
// the path, pool-key auth, (policies), the governor's admit, and the release with the caller's outcome.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Governor } from '../governor/governor.js';
import type { Logger } from '../log.js';
import type { AccessLog } from '../pool-request/access-log.js';
import { governorHeaders, refusalReply } from '../pool-request/refusal.js';
import { authenticateStage } from '../pool-request/authenticate.js';
import { BodyLimit } from '../pool-request/body-limit.js';
import { hasBody, type ResponseEncoder } from '../pool-request/codec.js';
import { NodeResponseEncoder, nodeBodySource, readNodeHeaders } from '../pool-request/node-http.js';
import { newExchange, peerAddress, type Exchange, type Stage, type OutcomeName } from '../pool-request/exchange.js';
import type { PoolEntry, SnapshotFeed } from '../pool-request/snapshot.js';
import { acquireWait } from './acquire-wait.js';
import { readBody } from './body.js';
import type { LockAcquireRecord } from '../pool-request/release.js';
import type { LeaseAdmission, LeaseRegistry, LeaseTerms } from './lease-registry.js';
import { MemoryLeaseRegistry } from './memory-leases.js';
import { parseJsonObject, parseOutcome } from './outcome.js';
import { sendError, sendJson } from './respond.js';
import type { HttpCode } from '../errors/catalogue.js';
import { matchLockRoute, type LockRoute } from './routes.js';
import { readPollRequest, servePoll, type JobRouteDeps } from '../jobs/routes.js';
import { matchJobRoute } from '../jobs/poll.js';
import type { PoliciesGate } from '../policies/index.js';

/** Largest acquire body (spec: "not shown"); `{"waitMs":…}` needs under 30 bytes. */
export const ACQUIRE_BODY_LIMIT = 4 * 1024;
/** Largest release body: room for a full set of upstream response headers. */
export const RELEASE_BODY_LIMIT = 64 * 1024;
/** The 413 rule (src/pool-request/body-limit.ts) for each. */
const ACQUIRE_BODY = new BodyLimit(ACQUIRE_BODY_LIMIT, `the request body exceeds ${ACQUIRE_BODY_LIMIT} bytes`);
const RELEASE_BODY = new BodyLimit(RELEASE_BODY_LIMIT, `the request body exceeds ${RELEASE_BODY_LIMIT} bytes`);

export interface LockServerOptions {
  host: string;
  port: number;
  governor: Governor;
  /** The data plane's snapshot source: one view of pools and keys for both listeners. */
  snapshots: SnapshotFeed;
  log: Logger;
  /** The pool access log (acquire attempts are written there; renew and release are not). */
  accessLog: AccessLog | null;
  /** Defaults to the in-memory registry over `governor`. */
  leases?: LeaseRegistry;
  /** Unix ms: lease deadlines and key expiry. */
  clock?: () => number;
  /** Job polling (GET /pools/{pool}/jobs/{id}[/result]) is served on this host too. */
  jobs?: JobRouteDeps | null;
  /** Stage 4 on acquire: the pools' policies (src/policies policiesGate); absent runs none. */
  policies?: PoliciesGate | null;
  /** Counts each acquire attempt (Prometheus and the metrics summary); absent counts nothing. */
  metrics?: { recordLockAcquire(r: LockAcquireRecord): void } | null;
}

/** A pool's lease settings, as the registry takes them on acquire and release. */
function leaseTerms(pool: PoolEntry): LeaseTerms {
  return { termMs: pool.settings.leaseTermMs, requestTimeoutMs: pool.settings.requestTimeoutMs };
}

/** One lock call as the stages see it: the data plane's Exchange plus the matched route. */
interface LockCall {
  ex: Exchange;
  route: LockRoute;
  client: ResponseEncoder;
  head: boolean;
  /** The governor's answer to an acquire, once it came. */
  governed?: LockAcquireRecord['admission'];
}

export class LockServer {
  readonly leases: LeaseRegistry;
  readonly #opts: LockServerOptions;
  readonly #clock: () => number;
  readonly #server: Server;
  readonly #stages: readonly Stage[];
  #port = 0;
  #closing: Promise<void> | null = null;

  private constructor(opts: LockServerOptions) {
    this.#opts = opts;
    this.#clock = opts.clock ?? Date.now;
    this.leases = opts.leases ?? new MemoryLeaseRegistry({ governor: opts.governor, clock: this.#clock });
    // Stage 4 (policies) runs in #acquire on the body read whole; a stage added here runs for every endpoint.
    // Method scope (stage 3) is not applied: the lock API forwards nothing (docs/lock.md).
    this.#stages = [authenticateStage(this.#clock)];
    // No request timeout: an acquire may wait in the governor's queue as long as it asked (its own deadline).
    this.#server = createServer({ headersTimeout: 10_000, requestTimeout: 0, keepAliveTimeout: 10_000 }, (req, res) => this.#handle(req, res));
  }

  static async start(opts: LockServerOptions): Promise<LockServer> {
    const s = new LockServer(opts);
    await s.#listen();
    return s;
  }

  get port(): number {
    return this.#port;
  }

  #listen(): Promise<void> {
    const { host, port } = this.#opts;
    const server = this.#server;
    return new Promise((resolve, reject) => {
      const failed = (err: Error) => reject(new Error(`lock API cannot listen on ${host}:${port}: ${err.message}`));
      server.once('error', failed);
      server.listen(port, host, () => {
        server.off('error', failed);
        this.#port = (server.address() as { port: number }).port;
        resolve();
      });
    });
  }

  #handle(req: IncomingMessage, res: ServerResponse): void {
    const method = req.method ?? 'GET';
    const head = method === 'HEAD';
    const client = new NodeResponseEncoder(req, res, head);
    const url = req.url ?? '';
    const q = url.indexOf('?');
    const path = q === -1 ? url : url.slice(0, q);
    const jobs = this.#opts.jobs;
    const job = jobs ? matchJobRoute(path) : null;
    if (jobs && job) {
      void servePoll(jobs, client, job, readPollRequest(req, path));
      return;
    }
    const route = matchLockRoute(path);
    const headers = readNodeHeaders(req.rawHeaders);
    const ex = newExchange(method, path, q === -1 ? '' : url.slice(q + 1), headers, peerAddress(req.socket.remoteAddress), this.#opts.snapshots.current);
    const call: LockCall | null = route ? { ex, route, client, head } : null;
    const limit = route?.action === 'release' ? RELEASE_BODY : ACQUIRE_BODY;
    if (!hasBody(headers)) {
      this.#run(call, client, head, method, Buffer.alloc(0));
      return;
    }
    if (limit.declaredOver(headers)) {
      this.#tooLarge(call, client, limit);
      return;
    }
    // Bodies are small: read them whole before any other decision, so every answer leaves the connection in step.
    readBody(nodeBodySource(req, res, false), client, limit).then(
      (b) => {
        if (b.ok) this.#run(call, client, head, method, b.body);
        else if (b.reason === 'too_large') this.#tooLarge(call, client, limit);
        else if (call?.route.action === 'acquire' && method === 'POST') this.#log(call, 'client_aborted', 0);
      },
      (err: unknown) => this.#fail(call, err),
    );
  }

  #tooLarge(call: LockCall | null, client: ResponseEncoder, limit: BodyLimit): void {
    // The rest of the body is unread: close that connection rather than parse it.
    client.sendReply(limit.reply, null, true);
    if (call?.route.action === 'acquire' && call.ex.method === 'POST') this.#log(call, 'payload_too_large', 413);
  }

  /** Runs one call; a bug costs this call (500), never the process. */
  #run(call: LockCall | null, client: ResponseEncoder, head: boolean, method: string, body: Buffer): void {
    try {
      if (call === null) {
        sendError(client, head, 404, 'not_found', 'no lock API endpoint at this path');
        return;
      }
      if (method !== 'POST') {
        sendError(client, head, 405, 'method_not_allowed', 'lock API endpoints take POST', [['allow', 'POST']]);
        return;
      }
      const pool = this.#admitCaller(call);
      if (pool === null) return;
      const r = call.route;
      const work = r.action === 'acquire' ? this.#acquire(call, pool, body) : r.action === 'renew' ? this.#renew(call, pool) : this.#release(call, pool, body);
      work.catch((err: unknown) => this.#fail(call, err));
    } catch (err) {
      this.#fail(call, err);
    }
  }

  #fail(call: LockCall | null, err: unknown): void {
    this.#opts.log.error({ err }, 'lock API request handler failed');
    if (call) {
      sendError(call.client, call.head, 500, 'internal_error', 'internal error');
      if (call.route.action === 'acquire' && !call.ex.settled) this.#log(call, 'internal_error', 500);
    }
  }

  /** Stages 1–2 (and the policies hook): the pool named in the path, then pool auth. Null: answered. */
  #admitCaller(call: LockCall): PoolEntry | null {
    const { ex, route } = call;
    const stop = (status: number, error: HttpCode, message: string): null => {
      sendError(call.client, call.head, status, error, message);
      if (route.action === 'acquire') this.#log(call, error, status);
      return null;
    };
    const pool = ex.snapshot.pools.get(route.pool);
    if (pool === undefined) return stop(404, 'not_found', 'no such pool');
    if (pool.status !== 'active') return stop(503, 'unavailable', 'this pool is suspended');
    ex.pool = pool;
    for (const stage of this.#stages) {
      const r = stage(ex);
      // Spec (Lock API errors): a policy refusal (e.g. an IP allowlist miss) is 403 `unauthorized` here.
      if (r !== null) return stop(r.status, r.status === 401 || r.status === 403 ? 'unauthorized' : r.error, r.message);
    }
    return pool;
  }

  async #acquire(call: LockCall, pool: PoolEntry, body: Buffer): Promise<void> {
    const { ex, client, head } = call;
    if (this.#opts.policies) {
      // Stage 4 before a slot, on the body already read whole (a signed acquire hashes it).
      const v = await this.#opts.policies({ ...ex, pool, peer: ex.clientAddress }, body);
      if (v !== null) {
        // Spec (Lock API errors): an allowlist miss is 403 and a bad signature or nonce replay 401, both `unauthorized`.
        const error: HttpCode = v.status === 401 || v.status === 403 ? 'unauthorized' : v.status === 413 ? 'payload_too_large' : 'unavailable';
        sendError(client, head, v.status, error, v.message);
        return this.#log(call, error, v.status);
      }
    }
    const parsed = parseJsonObject(body);
    const wait = parsed.ok ? acquireWait(parsed.value, ex.headers, pool.settings.queueTimeoutMs) : parsed;
    if (!wait.ok) {
      sendError(client, head, 400, 'bad_request', wait.message);
      this.#log(call, 'bad_request', 400);
      return;
    }
    let pending = this.leases.acquire({ poolId: pool.id, waitMs: wait.value, abortable: client }, leaseTerms(pool));
    if (pending instanceof Promise) {
      pending = await pending.catch((err: unknown): LeaseAdmission => {
        this.#opts.log.error({ err }, 'lease acquire failed');
        return { ok: false, reason: 'unavailable', queuedMs: 0 };
      });
    }
    const a = pending;
    ex.queuedMs = a.queuedMs;
    // Queued only when the governor really put it in its queue (the Redis registry always answers later).
    ex.waited = a.queued === true;
    call.governed = a.ok ? { ok: true, queuedMs: a.queuedMs } : { ok: false, reason: a.reason, queuedMs: a.queuedMs };
    if (!a.ok) {
      if (a.reason === 'aborted' || !client.open) return this.#log(call, 'client_aborted', 0);
      const r = refusalReply(a, governorHeaders(this.#opts.governor, pool.id, a.queuedMs))!;
      sendError(client, head, r.status, r.error, r.message, r.headers);
      return this.#log(call, r.error, r.status);
    }
    const lease = a.lease;
    if (!client.open) {
      // Granted after the caller left: nobody holds the slot, give it straight back.
      await this.leases.release(pool.id, lease.slotId, { dropped: true });
      return this.#log(call, 'client_aborted', 0);
    }
    sendJson(
      client,
      head,
      200,
      {
        slotId: lease.slotId,
        leaseDeadline: lease.leaseDeadline,
        requestDeadline: lease.requestDeadline,
        termMs: lease.termMs,
        renewIntervalMs: Math.min(pool.settings.renewIntervalMs, lease.termMs),
      },
      governorHeaders(this.#opts.governor, pool.id, a.queuedMs),
    );
    this.#log(call, 'lease_granted', 200);
  }

  async #renew(call: LockCall, pool: PoolEntry): Promise<void> {
    const r = await Promise.resolve(this.leases.renew(pool.id, call.route.slotId!)).catch((err: unknown) => this.#storeDown(call, err));
    if (r === null) return;
    if (r.ok) sendJson(call.client, call.head, 200, { leaseDeadline: r.leaseDeadline });
    else if (r.reason === 'capped') sendError(call.client, call.head, 409, 'capped', 'the slot reached its request deadline; release it');
    else sendError(call.client, call.head, 404, 'not_found', 'no such slot: released, reclaimed or never granted');
  }

  async #release(call: LockCall, pool: PoolEntry, body: Buffer): Promise<void> {
    const parsed = parseJsonObject(body);
    const outcome = parsed.ok ? parseOutcome(parsed.value) : parsed;
    // Validated before anything changes: a refused report leaves the slot held (docs/lock.md).
    if (!outcome.ok) return sendError(call.client, call.head, 400, 'bad_request', outcome.message);
    const released = await Promise.resolve(this.leases.release(pool.id, call.route.slotId!, outcome.value, leaseTerms(pool))).catch((err: unknown) =>
      this.#storeDown(call, err),
    );
    if (released === null) return;
    sendJson(call.client, call.head, 200, { released });
  }

  /** The lease store (Redis) could not be reached: 503, nothing changed that the caller can see. */
  #storeDown(call: LockCall, err: unknown): null {
    this.#opts.log.warn({ err }, 'lease store unreachable');
    sendError(call.client, call.head, 503, 'unavailable', 'the lease store is unreachable; retry', [['retry-after', '1']]);
    return null;
  }

  /** One access-log line per acquire attempt (spec: renew and release are not logged). */
  #log(call: LockCall, outcome: OutcomeName, status: number): void {
    const ex = call.ex;
    if (ex.settled) return;
    ex.settled = true;
    if (ex.pool !== null) {
      this.#opts.metrics?.recordLockAcquire({ poolId: ex.pool.id, pool: ex.pool.subdomain, admission: call.governed ?? null, waited: ex.waited, outcome });
    }
    this.#opts.accessLog?.write({
      pool: ex.pool?.subdomain ?? null,
      method: ex.method,
      path: ex.path,
      status,
      outcome,
      queuedMs: Math.round(ex.queuedMs),
      upstreamMs: null,
      totalMs: Math.round(performance.now() - ex.startedAt),
      keyId: ex.key?.id ?? null,
    });
  }

  /** Stops listening, frees every held lease, and drops open connections. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      const closed = new Promise<void>((resolve) => this.#server.close(() => resolve()));
      await this.leases.close();
      this.#server.closeAllConnections();
      await closed;
    })();
    return this.#closing;
  }
}
