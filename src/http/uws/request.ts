// What the `uws` door reads from a uWebSockets.js request: the header record (while `req` is valid: it is not
// after the handler returns) and the body as the core's BodySource.
import type { HttpRequest, HttpResponse } from 'uWebSockets.js';
import type { BodySource } from '../../pool-request/codec.js';
import { EMPTY } from '../../pool-request/codec.js';

/**
 * The request's headers (lower-case names; repeated headers joined with ", "). A header is joined only to an own
 * property: `constructor` was joined to Object's.
 */
export function readUwsHeaders(req: HttpRequest): Record<string, string> {
  const headers: Record<string, string> = {};
  req.forEach((k, v) => {
    headers[k] = Object.hasOwn(headers, k) ? `${headers[k]}, ${v}` : v;
  });
  return headers;
}

/** The body as Buffers: uWS neuters each ArrayBuffer when its callback returns, so each chunk is copied once, here. */
export function uwsBodySource(res: HttpResponse): BodySource {
  return (h) => res.onData((chunk, isLast) => h(chunk.byteLength > 0 ? Buffer.from(chunk.slice(0)) : EMPTY, isLast));
}
