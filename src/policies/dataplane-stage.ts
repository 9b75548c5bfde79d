// Stage 4 as the data plane runs it: the pool's policies on one Exchange, before a slot. When the pool
// signs requests (HMAC) the body is read whole first, up to the pool's signedBodyLimit, and the
// request's RequestBody is then fed from that buffer (uWS only delivers a body to a handler attached
// synchronously, so the buffer takes the handler's place).
import { reply, type Exchange, type Reply, type Stage } from '../pool-request/exchange.js';
import type { BodySource } from '../pool-request/codec.js';
import type { BodyLimit } from '../pool-request/body-limit.js';
import type { Policies, PolicyRefusal, PolicyRequest, Verdict } from './index.js';

export type OnData = BodySource;

export interface PolicyStage {
  /** Refused at once. */
  readonly refusal: Reply | null;
  /** The verdict, when it needs the body or an async check (JWT, Redis nonces). */
  readonly pending: Promise<Reply | null> | null;
  /** The body source for the request's RequestBody when the body was taken for hashing; else null. */
  readonly onData: OnData | null;
}

const PASS: PolicyStage = { refusal: null, pending: null, onData: null };

export function replyOf(r: PolicyRefusal): Reply {
  switch (r.status) {
    case 401:
      return reply(401, 'unauthorized', r.message);
    case 403:
      return reply(403, 'forbidden', r.message);
    case 413:
      return reply(413, 'payload_too_large', r.message);
    case 503:
      return reply(503, 'unavailable', r.message, [['retry-after', '1']]);
  }
}

const toReply = (v: Verdict): Reply | null => (v === null ? null : replyOf(v));

/** Reads the whole body (within `limit`) from uWS; resolves null when it is larger. */
function readBody(onData: OnData, limit: BodyLimit): Promise<Buffer | null> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let over = false;
    onData((chunk, isLast) => {
      if (!over && chunk.byteLength > 0) {
        size += chunk.byteLength;
        if (limit.over(size)) {
          over = true;
          chunks.length = 0;
          resolve(null);
        } else {
          chunks.push(chunk);
        }
      }
      if (isLast && !over) resolve(Buffer.concat(chunks, size));
    });
  });
}

export function policyStage(policies: Policies, ex: Exchange, onData: OnData | null): PolicyStage {
  const compiled = policies.forPool(ex.pool!);
  if (compiled.policies.length === 0) return PASS;
  const req: PolicyRequest = {
    pool: ex.pool!,
    key: ex.key,
    keyInAuthorization: ex.keyInAuthorization,
    method: ex.method,
    path: ex.path,
    query: ex.query,
    headers: ex.headers,
    peer: ex.clientAddress,
    client: policies.clientAddress(ex.clientAddress, ex.headers),
  };
  const signed = compiled.signedBody;
  if (compiled.needsBody && signed !== null && onData !== null) {
    if (signed.declaredOver(ex.headers)) return { refusal: signed.reply, pending: null, onData: null };
    let feed: ((chunk: Buffer, end: boolean) => void) | null = null;
    const pending = readBody(onData, signed).then(async (body) => {
      if (body === null) return signed.reply;
      const r = toReply(await policies.run(compiled, req, body));
      // Admitted: hand the buffered body to the RequestBody that forwards it.
      if (r === null) feed?.(body, true);
      return r;
    });
    return { refusal: null, pending, onData: (h) => void (feed = h) };
  }
  const v = policies.run(compiled, req, null);
  if (v instanceof Promise) return { refusal: null, pending: v.then(toReply), onData: null };
  return v === null ? PASS : { refusal: replyOf(v), pending: null, onData: null };
}

/**
 * Stage 4 in a chain: refuses at once, or lets the request go on with the pending verdict on the Exchange
 * (the chain's end waits for it) and, when the body was taken for hashing, the buffer as its body source.
 */
export function policiesStage(policies: Policies): Stage {
  return (ex: Exchange) => {
    const s = policyStage(policies, ex, ex.body);
    if (s.refusal !== null) return s.refusal;
    if (s.onData !== null) ex.body = s.onData;
    ex.verdict = s.pending;
    return null;
  };
}
