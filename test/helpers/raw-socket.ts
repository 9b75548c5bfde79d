// A raw TCP client for the wire listeners' protocol tests: what the server sends is kept as it comes and read
// back one message at a time, by the framing the test names (MySQL packets, PostgreSQL messages).
import { connect, type Socket } from 'node:net';

/** One message at the front of `buf` and its size in bytes, or null while it has not all come. */
export type Framing<T> = (buf: Buffer) => { value: T; size: number } | null;

export interface RawSocket {
  socket: Socket;
  /** The next message by `framing`; null once the connection is closed without one. */
  next<T>(framing: Framing<T>): Promise<T | null>;
}

export function rawSocket(port: number): RawSocket {
  const socket = connect({ host: '127.0.0.1', port });
  let buf = Buffer.alloc(0);
  let closed = false;
  const waiters: Array<() => void> = [];
  const wake = () => waiters.splice(0).forEach((f) => f());
  socket.on('data', (c: Buffer) => {
    buf = Buffer.concat([buf, c]);
    wake();
  });
  socket.on('close', () => {
    closed = true;
    wake();
  });
  socket.on('error', () => {});
  return {
    socket,
    async next<T>(framing: Framing<T>): Promise<T | null> {
      for (;;) {
        const m = framing(buf);
        if (m) {
          buf = buf.subarray(m.size);
          return m.value;
        }
        if (closed) return null;
        await new Promise<void>((r) => waiters.push(r));
      }
    },
  };
}
