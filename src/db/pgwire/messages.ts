// Encoders of the few messages the listener writes itself (backend messages to clients, and the frames it
// injects upstream: a replayed Parse, a Close, a query); everything else is forwarded as received.

function frame(type: string, body: Buffer): Buffer {
  const out = Buffer.allocUnsafe(5 + body.length);
  out[0] = type.charCodeAt(0);
  out.writeInt32BE(4 + body.length, 1);
  body.copy(out, 5);
  return out;
}

function cstr(s: string): Buffer {
  return Buffer.from(`${s}\0`, 'utf8');
}

function int32(n: number): Buffer {
  const b = Buffer.allocUnsafe(4);
  b.writeInt32BE(n, 0);
  return b;
}

/** ErrorResponse (or NoticeResponse with type 'N'): severity, SQLSTATE and message, as libpq expects them. */
export function errorResponse(code: string, message: string, severity: 'ERROR' | 'FATAL' = 'ERROR', type: 'E' | 'N' = 'E'): Buffer {
  return frame(
    type,
    Buffer.concat([cstr(`S${severity}`), cstr(`V${severity}`), cstr(`C${code}`), cstr(`M${message}`), Buffer.from([0])]),
  );
}

export const AUTH_OK = frame('R', int32(0));
export const AUTH_CLEARTEXT = frame('R', int32(3));
/** The one-byte answers to SSLRequest and GSSENCRequest. */
export const SSL_YES = Buffer.from('S');
export const SSL_NO = Buffer.from('N');

export function parameterStatus(name: string, value: string): Buffer {
  return frame('S', Buffer.concat([cstr(name), cstr(value)]));
}

export function backendKeyData(pid: number, secret: number): Buffer {
  return frame('K', Buffer.concat([int32(pid), int32(secret)]));
}

const RFQ = { I: frame('Z', Buffer.from('I')), T: frame('Z', Buffer.from('T')), E: frame('Z', Buffer.from('E')) };
export function readyForQuery(status: 'I' | 'T' | 'E'): Buffer {
  return RFQ[status];
}

/** A simple Query. */
export function query(sql: string): Buffer {
  return frame('Q', cstr(sql));
}

/** Parse of a named statement: `rest` is the client's Parse body after its own name (query text and parameter types). */
export function parseNamed(name: string, rest: Buffer): Buffer {
  return frame('P', Buffer.concat([cstr(name), rest]));
}

/** Close of a prepared statement ('S') by name. */
export function closeStatement(name: string): Buffer {
  return frame('C', Buffer.concat([Buffer.from('S'), cstr(name)]));
}

/** Describe of a prepared statement ('S') by name. */
export function describeStatement(name: string): Buffer {
  return frame('D', Buffer.concat([Buffer.from('S'), cstr(name)]));
}

/** Where a frame is written in place (outbox.ts): `n` bytes at the returned offset of `reserved`. */
export interface FrameRoom {
  reserve(n: number): number;
  readonly reserved: Buffer;
}

/**
 * A client's Bind, bytes [start, end) of `buf`, with its statement name replaced by `statement` (with its
 * NUL), written into `room` (the server's outbox: no Buffer of its own, and no concat at the flush): the
 * portal name is bytes [start + 5, `stmtAt`) (with its NUL), and what follows the client's statement name
 * starts at `restAt`. Short runs copied by a loop (no Buffer.copy argument checks nor views: a Bind per
 * transaction).
 */
export function bindRenamed(room: FrameRoom, buf: Buffer, start: number, end: number, stmtAt: number, statement: Buffer, restAt: number): void {
  const at = stmtAt - start;
  const len = 4 + (at - 5) + statement.length + (end - restAt);
  const o = room.reserve(1 + len);
  const out = room.reserved;
  out[o] = 0x42;
  out[o + 1] = len >>> 24;
  out[o + 2] = (len >>> 16) & 0xff;
  out[o + 3] = (len >>> 8) & 0xff;
  out[o + 4] = len & 0xff;
  copyInto(out, o + 5, buf, start + 5, stmtAt);
  // The upstream name (37 bytes) in one builtin copy: a byte loop costs more until the caller reaches TurboFan.
  out.set(statement, o + at);
  copyInto(out, o + at + statement.length, buf, restAt, end);
}

/** Bytes [from, to) of `src` into `dst` at `at`: short runs (a portal name, a few parameters) by a loop, without making a view. */
function copyInto(dst: Buffer, at: number, src: Buffer, from: number, to: number): void {
  if (to - from > 64) {
    dst.set(src.subarray(from, to), at);
    return;
  }
  for (let i = from; i < to; i++) dst[at++] = src[i]!;
}

/** A CancelRequest packet for a server's process id and secret key. */
export function cancelRequest(pid: number, secret: number): Buffer {
  const b = Buffer.allocUnsafe(16);
  b.writeInt32BE(16, 0);
  b.writeInt32BE(80877102, 4);
  b.writeInt32BE(pid, 8);
  b.writeInt32BE(secret, 12);
  return b;
}

/** Fields of an ErrorResponse/NoticeResponse frame, by field code (S, V, C, M...). */
export function errorFields(f: Buffer): Map<string, string> {
  const out = new Map<string, string>();
  let at = 5;
  while (at < f.length && f[at] !== 0) {
    const code = String.fromCharCode(f[at]!);
    const nul = f.indexOf(0, at + 1);
    if (nul < 0) break;
    out.set(code, f.toString('utf8', at + 1, nul));
    at = nul + 1;
  }
  return out;
}
