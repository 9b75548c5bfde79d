// Reads a wire connection without Node.js's stream machinery. A `data` event costs, per read, a fresh
// ArrayBuffer shrunk to the bytes read, a Buffer object, the Readable push/emit path and a nextTick; on a
// database proxy that is two reads per transaction. net.Socket's documented `onread` option instead has
// libuv read into memory we hand it and calls us with the count: on a bare relay of pgbench -S at a fixed
// 15,000 tps, user CPU per transaction 9.1 → 6.2 µs (bench/RESULTS.md, "Database wire listeners").
//
// `onread` can only be given when a Socket is made, and ours are made by net.Server (accepted clients) or
// by the driver that logs in (server connections), so the connection's handle is moved to a new Socket
// made with it. Where that cannot be done safely (TLS, bytes already buffered, writes still pending, a
// Node.js without the handle) the socket is read with `data` events as before: same chunks, same calls.
import { Socket } from 'node:net';

/** Memory handed to the kernel per connection; a read gets at least MIN_ROOM of it, at most SLAB. */
const SLAB = 16 * 1024;
const MIN_ROOM = 4 * 1024;

export type ChunkSink = (chunk: Buffer) => void;

interface StreamHandle {
  /** Node.js's own record of whether the handle reads; the new Socket starts reading when it is false. */
  reading: boolean;
  readStop(): number;
  useUserBuffer(buf: Uint8Array): void;
}

/**
 * Slabs of one connection, carved read by read. A chunk is a view of a slab that is never written again
 * (a new slab replaces it when the room left is short), so the caller may keep it, queue it or hand it to a
 * write that completes later. An idle connection holds one slab.
 */
class Slabs {
  #slab = Buffer.allocUnsafeSlow(SLAB);
  #at = 0;

  /** The memory the next read goes into. */
  readonly next = (): Buffer => {
    if (SLAB - this.#at < MIN_ROOM) {
      this.#slab = Buffer.allocUnsafeSlow(SLAB);
      this.#at = 0;
    }
    return this.#slab.subarray(this.#at);
  };

  /** The bytes of the read that just landed in `into` (from next()). */
  take(into: Buffer, n: number): Buffer {
    this.#at += n;
    return into.subarray(0, n);
  }
}

/**
 * Delivers every chunk read from `socket` to `onChunk`, and returns the Socket to use from now on (write,
 * pause/resume, end, destroy and the drain/error/close events): a new one on the same connection when reads
 * could be taken over, else `socket` itself, read through `data` events. `socket` must be a connected TCP
 * socket that nothing else reads; a socket accepted with `pauseOnConnect` starts reading here.
 */
export function directReads(socket: Socket, onChunk: ChunkSink): Socket {
  const handle = movableHandle(socket);
  if (handle === null) {
    socket.on('data', onChunk);
    if (socket.isPaused()) socket.resume();
    return socket;
  }
  handle.readStop();
  handle.reading = false;
  const raw = socket as unknown as { _handle: unknown };
  raw._handle = null;
  // The old Socket lets go without closing the connection (it has no handle now); a server's connection
  // count drops with it, so net.Server.close() no longer waits for this connection: its owner ends it.
  socket.destroy();
  const slabs = new Slabs();
  const moved = new Socket({
    handle,
    readable: true,
    writable: true,
    onread: { buffer: slabs.next, callback: (n: number, into: Buffer) => (onChunk(slabs.take(into, n)), true) },
    // `handle` is the internal stream handle Socket takes (the typings describe only a bound socket's).
  } as unknown as ConstructorParameters<typeof Socket>[0]);
  return moved;
}

/** The socket's handle, when it can be moved to a Socket that reads into our memory; null otherwise. */
function movableHandle(socket: Socket): StreamHandle | null {
  if (socket.constructor !== Socket || socket.destroyed || socket.connecting) return null;
  if (socket.readableLength > 0 || socket.writableLength > 0 || socket.writableCorked > 0) return null;
  const handle = (socket as unknown as { _handle?: Partial<StreamHandle> | null })._handle;
  if (!handle || typeof handle.readStop !== 'function' || typeof handle.useUserBuffer !== 'function') return null;
  return handle as StreamHandle;
}
