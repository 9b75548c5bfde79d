// Stage 6, forward: the request to the origin over a keep-alive undici Pool per origin, both bodies
// streamed with backpressure, and the origin's answer streamed back to the client.
import { readFileSync } from 'node:fs';
import { createSecureContext, rootCertificates, type SecureContext } from 'node:tls';
import type { IncomingHttpHeaders } from 'node:http';
import type { Readable } from 'node:stream';
import { buildConnector, Pool, util, type Dispatcher } from 'undici';
import type { Socket } from 'node:net';
import { cutUpstream, hookedConnector } from './origin-socket.js';
import { Deadlines, type DeadlineList, type DeadlineNode } from './deadlines.js';
import type { Governor, Outcome } from '../governor/governor.js';
import { CidrList } from '../domain/cidr.js';
import { guardedConnector, targetRefusalOf, type ConnectTargets } from '../security/ssrf-connect-guard.js';
import { appendGovernorHeaders, governorHeaders } from '../pool-request/refusal.js';
import { EMPTY, type ResponseEncoder } from '../pool-request/codec.js';
import { reply, type Exchange, type Reply } from '../pool-request/exchange.js';
import type { PoolEntry } from '../pool-request/snapshot.js';
import { clientResponseHeadersFlat, upstreamRequestHeaders } from '../pool-request/headers.js';
import { BodyTooLargeError } from '../pool-request/body-limit.js';
import { BodyTimeoutError, type RequestBody } from '../pool-request/request-body.js';
import type { Settlement } from '../pool-request/release.js';
import type { BufferedRequest, BufferedResult } from '../pool-request/buffered.js';

/**
 * One undici Pool (keep-alive connections) per origin, trusting the system roots plus originCaFile. Every new
 * connection goes through the SSRF guard unless allowPrivateTargets: the origin was checked when the pool
 * was created, but its name may resolve elsewhere since (DNS rebinding). Requests on a kept-alive
 * connection pay nothing for it.
 */
export class Upstreams {
  readonly #pools = new Map<string, Pool>();
  readonly #secureContext: SecureContext | undefined;
  readonly #targets: ConnectTargets;
  readonly #trusted: CidrList;

  constructor(opts: { caFile: string | null; targets: ConnectTargets; trustedProxies: readonly string[] }) {
    this.#targets = opts.targets;
    this.#trusted = new CidrList(opts.trustedProxies);
    if (opts.caFile) {
      let pem: string;
      try {
        pem = readFileSync(opts.caFile, 'utf8');
      } catch (err) {
        throw new Error(`cannot read originCaFile ${opts.caFile}: ${(err as Error).message}`);
      }
      // `ca` replaces the default roots, so keep them alongside the extra ones. One context for every
      // connection: passing `ca` per connection would parse every root certificate on each handshake.
      this.#secureContext = createSecureContext({ ca: [...rootCertificates, pem] });
    }
  }

  /** The socket peer is a configured trusted proxy: its X-Forwarded-* headers are passed on. */
  trusts(peer: string): boolean {
    return this.#trusted.size > 0 && this.#trusted.hasText(peer);
  }

  get(origin: string): Pool {
    let pool = this.#pools.get(origin);
    if (!pool) {
      const tls = this.#secureContext ? { secureContext: this.#secureContext } : {};
      pool = new Pool(origin, {
        connect: hookedConnector(this.#targets.allowPrivate ? buildConnector(tls) : guardedConnector(this.#targets, tls)),
        keepAliveTimeout: 30_000,
        keepAliveMaxTimeout: 300_000,
      });
      this.#pools.set(origin, pool);
    }
    return pool;
  }

  /** Closes every pool: in-flight requests finish first, unless `force`. */
  async close(force = false): Promise<void> {
    const pools = [...this.#pools.values()];
    this.#pools.clear();
    await Promise.all(pools.map((p) => (force ? p.destroy() : p.close()).catch(() => {})));
  }
}

const NO_BODY_STATUS = new Set([204, 205, 304]);

/** Drops an origin body nobody will read (destroying an undici body emits an error: swallow it). */
function discard(body: Readable): void {
  body.on('error', () => {});
  body.destroy();
}

/** Retry-After (seconds or an HTTP date) in ms; the clock is read only when the origin sent one. */
function retryAfterMs(value: string | string[] | undefined): number | undefined {
  const v = Array.isArray(value) ? value[0] : value;
  if (!v) return undefined;
  if (/^\d+$/.test(v.trim())) return Number(v.trim()) * 1000;
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/**
 * A Content-Length value as a number when it is only digits, else null: a loop over the characters rather than a
 * RegExp test on every response (the RegExp builtins were ~2,200 instructions a request that the floor does not
 * spend, callgrind; this is one of their callers, undici's check of the forwarded header values the others).
 */
function digitsValue(v: string | string[] | undefined): number | null {
  if (typeof v !== 'string' || v.length === 0) return null;
  for (let i = 0; i < v.length; i++) {
    const c = v.charCodeAt(i);
    if (c < 48 || c > 57) return null;
  }
  return Number(v);
}

const UNREACHABLE = reply(502, 'upstream_unreachable', 'the origin could not be reached');
const UPSTREAM_TIMEOUT = reply(504, 'upstream_timeout', 'the origin did not answer within the request timeout');

/** What a failed upstream call becomes for the client (when nothing was sent yet). */
function failureReply(err: unknown, body: RequestBody | null): Reply {
  // The 413 rule (src/pool-request/body-limit.ts): the body went over the limit while it was forwarded.
  if (body?.errored instanceof BodyTooLargeError) return body.errored.limit.reply;
  // The client went silent mid-body (the body timeout: src/pool-request/request-body.ts).
  if (body?.errored instanceof BodyTimeoutError || err instanceof BodyTimeoutError) return BodyTimeoutError.reply;
  if (err instanceof BodyTooLargeError) return err.limit.reply;
  const code = (err as { code?: string } | null)?.code;
  if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT') return UPSTREAM_TIMEOUT;
  // undici refusing what the client sent (a method or header it will not forward, a body that does
  // not match its Content-Length) is the client's error, never a 5xx.
  if (code === 'UND_ERR_INVALID_ARG' || code === 'UND_ERR_NOT_SUPPORTED' || code === 'UND_ERR_REQ_CONTENT_LENGTH_MISMATCH') {
    return reply(400, 'bad_request', `the request cannot be forwarded: ${(err as Error).message}`);
  }
  return UNREACHABLE;
}

/**
 * Why the origin could not be reached, for the access log only: the SSRF guard's refusal names the address the
 * origin's name resolves to, which is the operator's to know and not the client's.
 */
function failureDetail(err: unknown): string | undefined {
  const refused = targetRefusalOf(err);
  if (refused) return refused.message;
  const code = (err as { code?: string } | null)?.code;
  return code ?? (err instanceof Error ? err.message : undefined);
}

export interface ForwardDeps {
  upstreams: Upstreams;
  governor: Governor;
}

/** Told once how a forwarded request ended. One function for every request (no closure per request). */
export type ForwardEnd = (ex: Exchange, s: Settlement) => void;

/**
 * Sends the admitted request to the origin and streams the answer to the client; `end` is called exactly once
 * with how it ended, from whichever callback ends it (no promise, so the slot is released in that callback, not a
 * microtask later). An error reply is sent here when no response had started. Forwarding watches the client
 * itself (no listener per request).
 */
export function forward(deps: ForwardDeps, ex: Exchange, client: ResponseEncoder, body: RequestBody | null, end: ForwardEnd): void {
  new Forwarding(deps, ex, client, body, end).start();
}

const CONNECT_REFUSED = reply(400, 'bad_request', 'the request cannot be forwarded: CONNECT is not supported');
/** Bytes of an answer drained for a client that left before the origin finished; past them the connection is cut. */
const DRAIN_LIMIT = 1024 * 1024;
const ABORTED = Object.assign(new Error('request aborted by the proxy'), { code: 'UND_ERR_ABORTED' });
/** The request timeouts of this thread's forwarded requests (one timer per timeout length, not one per request). */
const DEADLINES = new Deadlines();

/**
 * One request to the origin as an undici dispatch handler: no promise, Readable or AbortSignal per request,
 * and the origin's body goes from undici's callbacks straight to the client, with undici paused while the client's
 * socket is backed up. The wait for response headers has its own deadline, to the millisecond (undici's coarse
 * timers, about 1 s resolution, would let a 100 ms request timeout run for up to a second while the slot is held),
 * on a list of its timeout length (deadlines.ts) instead of a Node timer per request.
 *
 * It implements undici's handler interface as undici calls it (onConnect, onHeaders, onData, onComplete, onError):
 * a handler written to the controller interface (onRequestStart…) is wrapped per request in an UnwrapHandler and
 * an UnwrapController, and that wrapping went through V8's runtime on every request (bench:instructions).
 */
class Forwarding implements DeadlineNode {
  readonly #deps: ForwardDeps;
  readonly #ex: Exchange;
  readonly #client: ResponseEncoder;
  readonly #body: RequestBody | null;
  readonly #end: ForwardEnd;
  readonly #started = performance.now();
  /**
   * waiting: no response yet; streaming: the body is going to the client; draining: the client left and the
   * origin's answer is read and dropped, so that the slot is freed when the origin is done with the request;
   * done: resolved.
   */
  #state: 'waiting' | 'streaming' | 'draining' | 'done' = 'waiting';
  /** The client left before the response: it is drained (not sent) once it starts. */
  #orphaned = false;
  #drained = 0;
  /** undici's abort for this request, once it has a connection (null before). */
  #abort: ((err: Error) => void) | null = null;
  /** undici's resume after a pause (given with the response head), and whether undici is paused by us. */
  #resume: (() => void) | null = null;
  #paused = false;
  /** The client's onWritable handler is set (at the first pause). */
  #watchingClient = false;
  /** The request timeout's list while it runs (DeadlineNode's links and due time below). */
  #deadlines: DeadlineList | null = null;
  deadlinePrev: DeadlineNode | null = null;
  deadlineNext: DeadlineNode | null = null;
  deadlineAt = NaN;
  #upstream: Outcome | null = null;
  /** Content-Length of the origin's body; null: sent chunked. */
  #total: number | null = null;
  /** Body bytes handed to the client so far (Content-Length path). */
  #sent = 0;

  constructor(deps: ForwardDeps, ex: Exchange, client: ResponseEncoder, body: RequestBody | null, end: ForwardEnd) {
    this.#deps = deps;
    this.#ex = ex;
    this.#client = client;
    this.#body = body;
    this.#end = end;
  }

  start(): void {
    const ex = this.#ex;
    const pool = ex.pool!;
    // A tunnel is not a request to forward (undici's dispatch would try to set one up).
    if (ex.method === 'CONNECT') return this.#failBeforeResponse(CONNECT_REFUSED);
    this.#deadlines = DEADLINES.add(this, pool.settings.requestTimeoutMs);
    this.#client.onAbort(() => this.#onClientGone());
    const headers = upstreamRequestHeaders({
      headers: ex.headers,
      originHost: pool.originHost!,
      clientAddress: ex.clientAddress,
      trustForwarded: this.#deps.upstreams.trusts(ex.clientAddress),
      clientHost: ex.headers.host ?? '',
      keyInAuthorization: ex.keyInAuthorization,
      credential: pool.credential,
    });
    // dispatch() reports its own failures through onError, synchronously or later.
    this.#deps.upstreams.get(pool.origin!).dispatch(
      {
        origin: pool.origin!,
        path: ex.query ? `${ex.path}?${ex.query}` : ex.path,
        method: ex.method as Dispatcher.HttpMethod,
        headers,
        body: this.#body,
        headersTimeout: 0,
        // Between body chunks: a stalled origin body is cut after the same timeout.
        bodyTimeout: pool.settings.requestTimeoutMs,
      },
      this,
    );
  }

  onConnect(abort: (err: Error) => void): void {
    this.#abort = abort;
    // Given up before the request got a connection (timeout, client gone): cut it now.
    if (this.#state === 'done') abort(ABORTED);
  }

  #pause(): void {
    this.#paused = true;
    // Told when the client's socket drains: asked for at the first backup only (most responses never back up).
    if (!this.#watchingClient) {
      this.#watchingClient = true;
      this.#client.onWritable(() => this.#resumeUpstream());
    }
  }

  #resumeUpstream(): void {
    if (!this.#paused) return;
    this.#paused = false;
    this.#resume?.();
  }

  /** undici: the response head. Returns false to pause the body (undici's contract). */
  onHeaders(status: number, rawHeaders: Buffer[], resume: () => void): boolean {
    this.#resume = resume;
    this.#onResponseStart(status, rawHeaders);
    return !this.#paused;
  }

  #onResponseStart(status: number, rawHeaders: Buffer[]): void {
    // 1xx informational answers are not the response.
    if (status < 200 || this.#state !== 'waiting') return;
    this.#clearTimer();
    const headers = util.parseHeaders(rawHeaders) as IncomingHttpHeaders;
    const ex = this.#ex;
    const client = this.#client;
    const upstream: Outcome = {
      status,
      throttled: status === 429 ? 1 : 0,
      retryAfterMs: retryAfterMs(headers['retry-after']),
      headers,
    };
    this.#upstream = upstream;
    if (!client.open) {
      this.#state = 'draining';
      return;
    }
    const length = digitsValue(headers['content-length']);
    client.encodeHeadersFlat(status, appendGovernorHeaders(clientResponseHeadersFlat(headers), this.#deps.governor, ex.pool!.id, ex.queuedMs), length);
    if (ex.method === 'HEAD' || NO_BODY_STATUS.has(status)) {
      client.endWithoutBody(ex.method === 'HEAD' && length !== null ? length : undefined);
      this.#done();
      return;
    }
    this.#total = length;
    this.#state = 'streaming';
  }

  /** undici: a chunk of the response body. Returns false to pause (undici's contract). */
  onData(chunk: Buffer): boolean {
    this.#onResponseData(chunk);
    return !this.#paused;
  }

  #onResponseData(chunk: Buffer): void {
    if (this.#state === 'draining') {
      this.#drained += chunk.length;
      if (this.#drained > DRAIN_LIMIT) this.#cut(this.#orphanSettlement());
      return;
    }
    if (this.#state !== 'streaming') return;
    const client = this.#client;
    if (!client.open) return;
    const total = this.#total;
    if (total === null) {
      if (!client.encodeData(chunk, false) && client.open) this.#pause();
      return;
    }
    // The chunk that reaches the Content-Length ends the response (bytes past it are not the client's).
    const rest = total - this.#sent;
    const last = chunk.length >= rest;
    if (chunk.length > rest) chunk = chunk.subarray(0, rest);
    this.#sent += chunk.length;
    const ok = client.encodeData(chunk, last);
    if (last) this.#done();
    else if (!ok && client.open) this.#pause();
  }

  /** undici: the response ended (trailers are not passed on). */
  onComplete(): void {
    // The origin is done with it and the connection goes back to the pool clean: now the slot is free.
    if (this.#state === 'draining') return this.#finish(this.#orphanSettlement());
    if (this.#state !== 'streaming') return;
    if (this.#total === null || this.#total === 0) {
      this.#client.encodeData(EMPTY, true);
      this.#done();
    } else {
      this.#shortBody();
    }
  }

  /** The origin sent fewer bytes than it announced: the client must not take this as complete. */
  #shortBody(): void {
    this.#client.close();
    this.#finish({ outcome: 'upstream_aborted', status: this.#client.status, upstream: { ...this.#upstream!, dropped: true }, detail: 'the origin sent fewer bytes than its Content-Length' });
  }

  onError(err: Error): void {
    if (this.#state === 'done') return;
    this.#clearTimer();
    if (this.#state === 'draining' || this.#orphaned) return this.#finish(this.#orphanSettlement());
    const client = this.#client;
    if (this.#state === 'streaming') {
      // Aborting for a client that left also errors the body: that is still the client's doing.
      const gone = client.aborted;
      client.close();
      // The log says what the client got: the origin's status once its head went out (then a cut body), else nothing.
      this.#finish({ outcome: gone ? 'client_aborted' : 'upstream_aborted', status: gone ? 0 : client.status, upstream: { ...this.#upstream!, dropped: true }, detail: gone ? undefined : failureDetail(err) });
      return;
    }
    if (client.aborted) {
      this.#finish({ outcome: 'client_aborted', status: 0 });
      return;
    }
    const r = failureReply(err, this.#body);
    this.#failBeforeResponse(r, r === UNREACHABLE ? failureDetail(err) : undefined);
  }

  /** The request timeout passed (DeadlineNode: called once, after it was taken off its list). */
  onDeadline(): void {
    this.#deadlines = null;
    if (this.#state !== 'waiting') return;
    if (this.#orphaned) return this.#cut(this.#orphanSettlement());
    this.#failBeforeResponse(UPSTREAM_TIMEOUT, undefined, true);
  }

  /**
   * The client left. The origin is still serving the request, whatever happens to the connection (most servers do
   * not stop a handler when its client goes), so the slot stays taken until the origin is done: its answer is
   * drained (up to DRAIN_LIMIT bytes, within the request timeout) and the connection returned to the pool. Cutting
   * the connection instead would free the slot while the origin may not have noticed yet (issue 25 item 8: the
   * origin saw max_concurrent + 1). A request whose body had not all arrived cannot complete: it is cut.
   */
  #onClientGone(): void {
    if (this.#state === 'done' || this.#state === 'draining') return;
    const body = this.#body;
    if ((body !== null && !body.complete) || this.#abort === null) return this.#cut(this.#orphanSettlement());
    this.#orphaned = true;
    if (this.#state === 'streaming') {
      this.#state = 'draining';
      this.#resumeUpstream();
    }
  }

  #orphanSettlement(): Settlement {
    const upstream = this.#upstream;
    return upstream ? { outcome: 'client_aborted', status: 0, upstream: { ...upstream, dropped: true } } : { outcome: 'client_aborted', status: 0 };
  }

  /**
   * No answer from the origin: the error reply, and no latency sample for the adaptive limit. `cut`: the upstream
   * request is still under way and is cut here (the slot is freed once its connection is closed).
   */
  #failBeforeResponse(r: Reply, detail?: string, cut = false): void {
    const body = this.#body;
    // The rest of an unread request body is discarded with the connection.
    body?.release();
    this.#client.sendReply(r, governorHeaders(this.#deps.governor, this.#ex.pool!.id, this.#ex.queuedMs), body !== null && !body.complete);
    const s: Settlement = { outcome: r.error, status: r.status, upstream: { dropped: true, latencyMs: performance.now() - this.#started }, detail };
    if (cut) this.#cut(s);
    else this.#finish(s);
  }

  /**
   * Cuts the upstream request and settles once the origin connection it was on is closed, not before: until then
   * the origin may still be serving it, and a slot freed earlier lets the origin see max_concurrent + 1 (issue 25
   * item 8). A request that had no connection yet settles at once (nothing reached the origin).
   */
  #cut(s: Settlement): void {
    if (this.#state === 'done') return;
    this.#state = 'done';
    this.#clearTimer();
    this.#ex.upstreamMs = performance.now() - this.#started;
    const abort = this.#abort;
    // Our own onError runs inside abort() and sees state 'done'.
    const closing: Socket | null = abort === null ? null : cutUpstream(() => abort(ABORTED));
    if (closing === null) this.#end(this.#ex, s);
    else closing.once('close', () => this.#end(this.#ex, s));
  }

  #done(): void {
    const upstream = this.#upstream!;
    upstream.latencyMs = performance.now() - this.#started;
    this.#finish({ outcome: 'proxied', status: upstream.status!, upstream });
  }

  #finish(s: Settlement): void {
    if (this.#state === 'done') return;
    this.#state = 'done';
    this.#clearTimer();
    this.#ex.upstreamMs = performance.now() - this.#started;
    this.#end(this.#ex, s);
  }

  #clearTimer(): void {
    if (this.#deadlines !== null) this.#deadlines.remove(this);
    this.#deadlines = null;
  }
}

/**
 * The same forwarding as forward() (same upstream pool, header rules and credential injection) for a
 * request held in memory, collecting the answer into a buffer of at most `cap` bytes. The whole exchange,
 * body included, is bounded by the pool's requestTimeoutMs. Resolves, never rejects.
 */
export async function forwardBuffered(upstreams: Upstreams, pool: PoolEntry, req: BufferedRequest, cap: number): Promise<BufferedResult> {
  const abort = new AbortController();
  const started = performance.now();
  let timedOut = false;
  const deadline = setTimeout(() => {
    timedOut = true;
    abort.abort();
  }, pool.settings.requestTimeoutMs);
  const headers = upstreamRequestHeaders({
    headers: req.headers,
    originHost: pool.originHost!,
    clientAddress: req.clientAddress,
    trustForwarded: upstreams.trusts(req.clientAddress),
    clientHost: req.headers.host ?? '',
    keyInAuthorization: false,
    credential: pool.credential,
  });
  let res: Dispatcher.ResponseData;
  try {
    res = await upstreams.get(pool.origin!).request({
      origin: pool.origin!,
      path: req.query ? `${req.path}?${req.query}` : req.path,
      method: req.method as Dispatcher.HttpMethod,
      headers,
      body: req.body ?? undefined,
      signal: abort.signal,
      headersTimeout: 0,
      bodyTimeout: 0,
    });
  } catch (err) {
    clearTimeout(deadline);
    const latencyMs = performance.now() - started;
    const failure = timedOut ? UPSTREAM_TIMEOUT : failureReply(err, null);
    // A request undici will not send (400, as in forward()) fails the same way on every attempt.
    return { ok: false, error: failure.message, retryable: failure.status !== 400, upstream: { dropped: true, latencyMs } };
  }
  const chunks: Buffer[] = [];
  let size = 0;
  let truncated = false;
  let drained = false;
  if (req.method !== 'HEAD' && !NO_BODY_STATUS.has(res.statusCode)) {
    try {
      for await (const chunk of res.body as AsyncIterable<Buffer>) {
        const room = cap - size;
        if (chunk.length > room) {
          if (room > 0) chunks.push(chunk.subarray(0, room));
          size = cap;
          truncated = true;
          break;
        }
        chunks.push(chunk);
        size += chunk.length;
      }
      drained = !truncated;
    } catch {
      // The origin answered, then broke off (or the deadline cut the body): keep what arrived.
      truncated = true;
    }
  }
  // A body read to its end frees its connection for reuse; any other is cut.
  if (!drained) discard(res.body);
  clearTimeout(deadline);
  const respHeaders: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(res.headers)) if (v !== undefined) respHeaders[k] = v;
  const upstream: Outcome = {
    status: res.statusCode,
    throttled: res.statusCode === 429 ? 1 : 0,
    retryAfterMs: retryAfterMs(res.headers['retry-after']),
    headers: res.headers,
    latencyMs: performance.now() - started,
  };
  return { ok: true, response: { status: res.statusCode, headers: respHeaders, body: Buffer.concat(chunks, size), truncated }, upstream };
}
