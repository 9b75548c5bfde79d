// The 413 rule, in one place: a request body over the limit is refused with 413 payload_too_large, whether
// its Content-Length says so (a stage, before a slot and before any byte is read) or its bytes say so as
// they arrive (a body sent chunked, or longer than it declared). One BodyLimit per limit: the proxy's
// (POOLGATE_PROXY_BODY_LIMIT), SQL over HTTP's (POOLGATE_SQL_BODY_LIMIT), a pool's signed-body limit.
import { reply, type Exchange, type Reply, type Stage } from './exchange.js';

export class BodyLimit {
  /** The answer to a body over the limit, built once. */
  readonly reply: Reply;

  /** At most `bytes` of body (0: none at all). `message` is the reply's message (it names what raises it). */
  constructor(
    readonly bytes: number,
    message: string,
  ) {
    this.reply = reply(413, 'payload_too_large', message);
  }

  /** `bytes` of body (received so far, or declared) are over the limit. */
  over(bytes: number): boolean {
    return bytes > this.bytes;
  }

  /** The request's Content-Length is over the limit. */
  declaredOver(headers: Readonly<Record<string, string>>): boolean {
    return Number(headers['content-length'] ?? 0) > this.bytes;
  }
}

/** A body over the limit, met while reading it (RequestBody destroys itself with this). */
export class BodyTooLargeError extends Error {
  override name = 'BodyTooLargeError';
  constructor(readonly limit: BodyLimit) {
    super(limit.reply.message);
  }
}

/** The stage: a declared Content-Length over the limit is refused before a slot. */
export function bodyLimitStage(limit: BodyLimit): Stage {
  return (ex: Exchange) => (limit.declaredOver(ex.headers) ? limit.reply : null);
}
