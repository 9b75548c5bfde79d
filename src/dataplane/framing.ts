// Message framing checks uWebSockets.js 20.30 leaves to us (RFC 9112 §6): it frames a body by the first of
// two Content-Length headers and decodes any Transfer-Encoding as chunked. A request whose length the proxy
// and a front proxy could read differently is refused before any other stage, and its connection is closed
// (docs/http-front-door.md).
import { reply, type Reply } from '../pool-request/exchange.js';

const DIGITS = /^[0-9]{1,15}$/;
const BAD_LENGTH = reply(400, 'bad_request', 'Content-Length must be one decimal length');
const BOTH = reply(400, 'bad_request', 'a request may not carry both Transfer-Encoding and Content-Length');
const NOT_FINAL = reply(400, 'bad_request', 'chunked must be the final and only-once transfer coding');
const UNKNOWN_CODING = reply(501, 'not_implemented', 'the only transfer coding accepted is chunked');

/** null when the request's body length is unambiguous; else the refusal (its connection must close). */
export function framingRefusal(headers: Readonly<Record<string, string>>): Reply | null {
  const te = headers['transfer-encoding'];
  const cl = headers['content-length'];
  if (te === undefined) {
    // Repeated headers arrive joined with ", ", so two lengths (equal or not) fail here.
    return cl === undefined || DIGITS.test(cl) ? null : BAD_LENGTH;
  }
  if (cl !== undefined) return BOTH;
  if (te === 'chunked') return null;
  // Coding names are case-insensitive (RFC 9112 §7): `Chunked` and `CHUNKED` are chunked.
  const codings = te.toLowerCase().split(',');
  let chunked = 0;
  for (let i = 0; i < codings.length; i++) {
    const c = codings[i]!.trim();
    if (c === 'chunked') chunked++;
    codings[i] = c;
  }
  // RFC 9112 §6.3: chunked not final (or applied twice) leaves the length unknown: 400. A coding before a
  // final chunked is one we do not implement: 501 (§6.1).
  if (codings[codings.length - 1] !== 'chunked' || chunked !== 1) return NOT_FINAL;
  return codings.length === 1 ? null : UNKNOWN_CODING;
}
