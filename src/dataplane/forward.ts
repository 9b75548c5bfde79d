// Stage 6, forward: the request to the origin over a keep-alive undici Pool per origin, both bodies
// streamed with backpressure, and the origin's answer streamed back to the client.
import { readFileSync } from 'node:fs';
import { createSecureContext, rootCertificates, type SecureContext } from 'node:tls';
import type { Readable } from 'node:stream';
import { Pool, type Dispatcher } from 'undici';
import type { Governor, Outcome } from '../governor/governor.js';
import { governorHeaders } from './admit.js';
import type { ClientResponse } from './client-response.js';
import { reply, type Exchange, type Reply } from './exchange.js';
import type { PoolEntry } from './snapshot.js';
import { clientResponseHeaders, upstreamRequestHeaders } from './headers.js';
import { BodyTooLargeError, type RequestBody } from './request-body.js';
import type { Settlement } from './release.js';

/** One undici Pool (keep-alive connections) per origin, trusting the system roots plus originCaFile. */
export class Upstreams {
  readonly #pools = new Map<string, Pool>();
  readonly #secureContext: SecureContext | undefined;

  constructor(opts: { caFile: string | null }) {
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

  get(origin: string): Pool {
    let pool = this.#pools.get(origin);
    if (!pool) {
      pool = new Pool(origin, {
        connect: this.#secureContext ? { secureContext: this.#secureContext } : {},
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

/** Retry-After (seconds or an HTTP date) in ms. */
function retryAfterMs(value: string | string[] | undefined, now: number): number | undefined {
  const v = Array.isArray(value) ? value[0] : value;
  if (!v) return undefined;
  if (/^\d+$/.test(v.trim())) return Number(v.trim()) * 1000;
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

const UPSTREAM_TIMEOUT = reply(504, 'upstream_timeout', 'the origin did not answer within the request timeout');

/** What a failed upstream call becomes for the client (when nothing was sent yet). */
function failureReply(err: unknown, body: RequestBody | null): Reply {
  if (body?.errored instanceof BodyTooLargeError || err instanceof BodyTooLargeError) {
    return reply(413, 'payload_too_large', (body?.errored as Error | undefined)?.message ?? 'request body too large');
  }
  const code = (err as { code?: string } | null)?.code;
  if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT') return UPSTREAM_TIMEOUT;
  // undici refusing what the client sent (a method or header it will not forward, a body that does
  // not match its Content-Length) is the client's error, never a 5xx.
  if (code === 'UND_ERR_INVALID_ARG' || code === 'UND_ERR_NOT_SUPPORTED' || code === 'UND_ERR_REQ_CONTENT_LENGTH_MISMATCH') {
    return reply(400, 'bad_request', `the request cannot be forwarded: ${(err as Error).message}`);
  }
  return reply(502, 'upstream_unreachable', 'the origin could not be reached');
}

export interface ForwardDeps {
  upstreams: Upstreams;
  governor: Governor;
}

/**
 * Sends the admitted request to the origin and streams the answer to the client. Resolves (never
 * rejects) with how it ended; an error reply is sent here when no response had started.
 */
export async function forward(deps: ForwardDeps, ex: Exchange, client: ClientResponse, body: RequestBody | null, abort: AbortController): Promise<Settlement> {
  const pool = ex.pool!;
  const { signal } = abort;
  const started = performance.now();
  // Our own timer for the wait for response headers: undici's coarse timers (about 1 s resolution)
  // would let a 100 ms request timeout run for up to a second while the slot is held.
  let timedOut = false;
  const deadline = setTimeout(() => {
    timedOut = true;
    abort.abort();
  }, pool.settings.requestTimeoutMs);
  const headers = upstreamRequestHeaders({
    headers: ex.headers,
    originHost: pool.originHost!,
    clientAddress: ex.clientAddress,
    clientHost: ex.headers.host ?? '',
    keyInAuthorization: ex.keyInAuthorization,
    credential: pool.credential,
  });
  let res: Dispatcher.ResponseData;
  try {
    res = await deps.upstreams.get(pool.origin!).request({
      origin: pool.origin!,
      path: ex.query ? `${ex.path}?${ex.query}` : ex.path,
      method: ex.method as Dispatcher.HttpMethod,
      headers,
      body: body ?? undefined,
      signal,
      headersTimeout: 0,
      // Between body chunks: a stalled origin body is cut after the same timeout.
      bodyTimeout: pool.settings.requestTimeoutMs,
    });
  } catch (err) {
    clearTimeout(deadline);
    ex.upstreamMs = performance.now() - started;
    if (!timedOut && (signal.aborted || client.aborted)) return { outcome: 'client_aborted', status: 0 };
    const r = timedOut ? UPSTREAM_TIMEOUT : failureReply(err, body);
    // The rest of an unread request body is discarded with the connection.
    body?.release();
    client.sendReply(r, governorHeaders(deps.governor, pool.id, ex.queuedMs), body !== null && !body.complete);
    return {
      outcome: r.error,
      status: r.status,
      // No answer from the origin: not a latency sample for the adaptive limit.
      upstream: { dropped: true, latencyMs: ex.upstreamMs },
    };
  }

  clearTimeout(deadline);
  const status = res.statusCode;
  const upstream: Outcome = {
    status,
    throttled: status === 429 ? 1 : 0,
    retryAfterMs: retryAfterMs(res.headers['retry-after'], Date.now()),
    headers: res.headers,
  };
  if (!client.open) {
    discard(res.body);
    ex.upstreamMs = performance.now() - started;
    return { outcome: 'client_aborted', status: 0, upstream: { ...upstream, dropped: true } };
  }
  client.writeHead(status, [...clientResponseHeaders(res.headers), ...governorHeaders(deps.governor, pool.id, ex.queuedMs)]);

  const cl = res.headers['content-length'];
  const length = typeof cl === 'string' && /^\d+$/.test(cl) ? Number(cl) : null;
  let ended: 'done' | 'client_aborted' | 'upstream_aborted';
  if (ex.method === 'HEAD' || NO_BODY_STATUS.has(status)) {
    discard(res.body);
    client.endWithoutBody(ex.method === 'HEAD' && length !== null ? length : undefined);
    ended = 'done';
  } else {
    ended = await pipeBody(client, res.body, length);
  }
  ex.upstreamMs = performance.now() - started;
  upstream.latencyMs = ex.upstreamMs;
  if (ended === 'done') return { outcome: 'proxied', status, upstream };
  return { outcome: ended, status: ended === 'client_aborted' ? 0 : status, upstream: { ...upstream, dropped: true } };
}

/**
 * Streams the origin's body to the client. With a known length uWS frames it (tryEnd: the part it could
 * not take yet is retried from onWritable); without one it is sent chunked. Either way the origin body
 * is paused while the client's socket is backed up.
 */
function pipeBody(client: ClientResponse, body: Readable, total: number | null): Promise<'done' | 'client_aborted' | 'upstream_aborted'> {
  return new Promise((resolve) => {
    let settled = false;
    const finish = (r: 'done' | 'client_aborted' | 'upstream_aborted') => {
      if (settled) return;
      settled = true;
      // A finished body drains on its own (its connection goes back to the pool); any other is cut.
      if (r !== 'done') body.destroy();
      resolve(r);
    };
    client.onAbort(() => finish('client_aborted'));
    body.on('error', () => {
      // Aborting for a client that left also errors the body: that is still the client's doing.
      const gone = client.aborted;
      client.close();
      finish(gone ? 'client_aborted' : 'upstream_aborted');
    });

    if (total === null) {
      body.on('data', (chunk: Buffer) => {
        if (!client.write(chunk) && client.open) body.pause();
      });
      client.onWritable(() => {
        body.resume();
        return true;
      });
      body.on('end', () => {
        client.end();
        finish('done');
      });
      return;
    }

    let pending: Buffer | null = null;
    let pendingAt = 0;
    body.on('data', (chunk: Buffer) => {
      if (!client.open) return;
      pendingAt = client.writeOffset();
      const [ok, done] = client.tryEnd(chunk, total);
      if (done) finish('done');
      else if (!ok) {
        pending = chunk;
        body.pause();
      }
    });
    client.onWritable((offset) => {
      if (pending === null) return true;
      const [ok, done] = client.tryEnd(pending.subarray(offset - pendingAt), total);
      if (done) {
        pending = null;
        finish('done');
      } else if (ok) {
        pending = null;
        body.resume();
      }
      return ok;
    });
    body.on('end', () => {
      if (settled) return;
      if (total === 0) {
        client.end();
        finish('done');
        return;
      }
      // The origin sent fewer bytes than it announced: the client must not take this as complete.
      client.close();
      finish('upstream_aborted');
    });
  });
}

/** A request to send to the origin from memory (an async job's stored request). */
export interface BufferedRequest {
  method: string;
  path: string;
  query: string;
  /** Client headers, names lower-case; pool auth already removed. */
  headers: Record<string, string>;
  clientAddress: string;
  body: Buffer | null;
}

/** The origin's answer collected into memory, cut at the cap. */
export interface BufferedResponse {
  status: number;
  headers: Record<string, string | string[]>;
  body: Buffer;
  /** The body is incomplete: over the cap, or the origin broke off mid-body. */
  truncated: boolean;
}

export type BufferedResult =
  | { ok: true; response: BufferedResponse; upstream: Outcome }
  /** No answer from the origin; `error` says why (timeout, unreachable, refused by undici). */
  | { ok: false; error: string; upstream: Outcome };

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
    const error = timedOut ? UPSTREAM_TIMEOUT.message : failureReply(err, null).message;
    return { ok: false, error, upstream: { dropped: true, latencyMs } };
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
    retryAfterMs: retryAfterMs(res.headers['retry-after'], Date.now()),
    headers: res.headers,
    latencyMs: performance.now() - started,
  };
  return { ok: true, response: { status: res.statusCode, headers: respHeaders, body: Buffer.concat(chunks, size), truncated }, upstream };
}
