// Two things the forward stage needs from each origin connection that undici 7 does not give a dispatch handler:
// which connection a request it cut was on (so the slot is freed once that connection is closed, not while the
// origin may still be serving the request), and tolerance of an unsolicited `100 Continue` (undici destroys the
// connection on any 100; RFC 9110 §15.2 says a client must accept an unexpected 1xx). Both hook the socket undici's
// connector returns, once per connection; nothing here runs per request except a check at each response start.
import type { Socket } from 'node:net';
import type { buildConnector } from 'undici';

/** Set only while a forwarding aborts its own upstream request: the socket undici destroys for it. */
let cutting: { socket: Socket | null } | null = null;

/**
 * Runs `abort` (a DispatchController's abort) and returns the origin connection undici destroyed for it, still
 * closing, or null when none was (the request had no connection yet, or it had already ended).
 */
export function cutUpstream(abort: () => void): Socket | null {
  const found = { socket: null as Socket | null };
  cutting = found;
  try {
    abort();
  } finally {
    cutting = null;
  }
  const s = found.socket;
  return s !== null && !s.closed ? s : null;
}

/** The bytes of `HTTP/1.x 100 ` by position (-1: any byte). */
const PATTERN = [0x48, 0x54, 0x54, 0x50, 0x2f, 0x31, 0x2e, -1, 0x20, 0x31, 0x30, 0x30, 0x20];
const END = Buffer.from('\r\n\r\n', 'latin1');
/** A 100 Continue head longer than this is not one we strip (it goes to undici as is). */
const MAX_INTERIM = 8 * 1024;

/** 'other': not a 100; 'partial': too short to tell; else the offset just past the 100's head. */
function interim(b: Buffer): 'other' | 'partial' | number {
  const n = Math.min(b.length, PATTERN.length);
  for (let i = 0; i < n; i++) if (PATTERN[i] !== -1 && b[i] !== PATTERN[i]) return 'other';
  if (b.length < PATTERN.length) return 'partial';
  const end = b.indexOf(END);
  if (end !== -1) return end + 4;
  return b.length > MAX_INTERIM ? 'other' : 'partial';
}

/**
 * Hooks one origin connection. We never send `Expect: 100-continue` upstream (`expect` is hop-by-hop), so a 100 is
 * always unsolicited: it is dropped before undici's parser sees it, and the final response that follows is
 * answered as usual. A response can start only after a request head was written (undici sends one request at a
 * time per connection), so only the first bytes after each request head are looked at.
 */
function hook(socket: Socket): void {
  const read = socket.read;
  const write = socket.write;
  const destroy = socket.destroy;
  /** The next bytes read start a response. */
  let atStart = false;
  let held: Buffer | null = null;
  // Fixed arity (write's own: chunk, encoding, callback; a missing one passes as undefined, as write takes it): a
  // rest parameter spread into the call allocated an array and went through CallVarargs on every write.
  socket.write = function (this: Socket, chunk: unknown, encoding?: unknown, callback?: unknown): boolean {
    // undici writes each request head as one latin1 string starting with the method (body framing strings start with CR).
    if (typeof chunk === 'string' && chunk.charCodeAt(0) !== 13) atStart = true;
    return (write as (c: unknown, e: unknown, cb: unknown) => boolean).call(this, chunk, encoding, callback);
  } as Socket['write'];
  socket.read = function (this: Socket, n?: number) {
    if (!atStart) return read.call(this, n);
    for (;;) {
      const more = read.call(this, n) as Buffer | null;
      const chunk = held === null ? more : more === null ? held : Buffer.concat([held, more]);
      held = null;
      if (chunk === null) return null;
      const at = interim(chunk);
      if (at === 'other') {
        atStart = false;
        return chunk;
      }
      if (at === 'partial') {
        held = chunk;
        if (more === null) return null;
        continue;
      }
      // A 100 Continue: dropped. Whatever follows (the final response, or another 1xx) is looked at the same way.
      if (at < chunk.length) held = chunk.subarray(at);
      else if (more === null) return null;
    }
  } as Socket['read'];
  socket.destroy = function (this: Socket, err?: Error) {
    if (cutting !== null && !this.destroyed) cutting.socket = this;
    return destroy.call(this, err);
  } as Socket['destroy'];
}

/** `base` with every connection it makes hooked (see hook()). */
export function hookedConnector(base: buildConnector.connector): buildConnector.connector {
  return (opts, callback) =>
    base(opts, (err, socket) => {
      if (socket) hook(socket as Socket);
      (callback as (e: Error | null, s: unknown) => void)(err, socket);
    });
}
