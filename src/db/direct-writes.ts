// Writes to a wire connection without Node.js's Writable machinery, the counterpart of direct-reads.ts. A
// socket.write costs, per call, the Writable state bookkeeping, a WriteWrap object made from a C++ template,
// the write itself, and a nextTick to finish it; a database proxy writes twice per transaction. Here the
// handle's writeBuffer is called with one reused request: when the kernel takes every byte at once (the
// usual case on a connection that keeps up), that request is never used, and nothing is left to finish.
// On a bare relay of pgbench -S under callgrind: 18,956 → 15,008 instructions per transaction.
//
// Where that cannot be done (TLS, a Node.js without the binding, bytes already queued by the Writable, a
// corked socket) the write goes through socket.write as before. A write the kernel cannot take at once
// stays queued in libuv (which keeps writes, and a later shutdown, in order) and the writer answers false
// until it is done, then emits the socket's 'drain', as socket.write's callers expect. socket.bytesWritten
// counts these writes too (it reads the handle's own count; test/operator-log-lines.test.ts).
import { Socket } from 'node:net';

interface StreamBaseBinding {
  WriteWrap: new () => WriteReq;
  streamBaseState: Int32Array;
  kLastWriteWasAsync: number;
}

interface WriteReq {
  handle: unknown;
  oncomplete: ((status: number) => void) | null;
  buffer: Buffer | null;
}

interface WritableHandle {
  writeBuffer(req: WriteReq, bytes: Buffer): number;
}

/** Node.js's stream binding, when this runtime still exposes it; null otherwise (every write then uses socket.write). */
const binding: StreamBaseBinding | null = (() => {
  try {
    const b = (process as unknown as { binding(name: string): Partial<StreamBaseBinding> }).binding('stream_wrap');
    if (typeof b.WriteWrap !== 'function' || !(b.streamBaseState instanceof Int32Array) || typeof b.kLastWriteWasAsync !== 'number') return null;
    return b as StreamBaseBinding;
  } catch {
    return null;
  }
})();

export class DirectWriter {
  readonly #socket: Socket;
  readonly #handle: WritableHandle | null;
  /** The request handed to writeBuffer; replaced when a write keeps it (went asynchronous). */
  #req: WriteReq | null = null;
  /** Writes queued in libuv, not yet done. */
  #pending = 0;

  constructor(socket: Socket) {
    this.#socket = socket;
    const handle = (socket as unknown as { _handle?: Partial<WritableHandle> | null })._handle;
    this.#handle = binding !== null && socket.constructor === Socket && handle && typeof handle.writeBuffer === 'function' ? (handle as WritableHandle) : null;
  }

  /** Whether writes are waiting (here or in the socket's own queue). */
  get needDrain(): boolean {
    return this.#pending > 0 || this.#socket.writableNeedDrain;
  }

  /** As socket.write: false asks the caller to wait for the socket's 'drain'. */
  write(bytes: Buffer): boolean {
    const socket = this.#socket;
    const handle = this.#handle;
    if (handle === null || socket.writableLength > 0 || socket.writableCorked > 0 || socket.destroyed || !socket.writable || (socket as unknown as { _handle: unknown })._handle !== handle) {
      return socket.write(bytes);
    }
    const req = (this.#req ??= new binding!.WriteWrap());
    req.handle = handle;
    const err = handle.writeBuffer(req, bytes);
    if (err !== 0) {
      // As socket.write reports a failed write: the socket is destroyed with the error ('error', then 'close').
      socket.destroy(Object.assign(new Error(`write failed (${err})`), { errno: err, syscall: 'write' }));
      return false;
    }
    if (binding!.streamBaseState[binding!.kLastWriteWasAsync] === 0) return true;
    // The kernel took part of it: libuv keeps the rest, and this request, until the write is done.
    this.#req = null;
    this.#pending++;
    req.buffer = bytes;
    req.oncomplete = (status: number) => {
      req.buffer = null;
      this.#pending--;
      if (status < 0) {
        socket.destroy(Object.assign(new Error(`write failed (${status})`), { errno: status, syscall: 'write' }));
        return;
      }
      if (this.#pending === 0) socket.emit('drain');
    };
    return false;
  }
}
