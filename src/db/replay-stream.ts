// TLS over a socket some of whose bytes were read already (by direct reads, in JavaScript): a duplex that
// yields those bytes first and then the socket's, for a TLSSocket to run over.
import { Duplex } from 'node:stream';
import type { Socket } from 'node:net';

/** A duplex over `raw` that first yields `head` (bytes already read off it). */
export function replaying(raw: Socket, head: Buffer): { stream: Duplex; push: (chunk: Buffer) => void } {
  const d = new Duplex({
    read: () => void raw.resume(),
    write: (chunk: Buffer, _enc, cb) => void raw.write(chunk, cb),
    final: (cb) => {
      raw.end();
      cb();
    },
    destroy: (err, cb) => {
      raw.destroy();
      cb(err);
    },
  });
  d.push(head);
  const push = (c: Buffer): void => {
    if (!d.push(c)) raw.pause();
  };
  raw.on('end', () => d.push(null));
  raw.on('error', (err) => d.destroy(err));
  raw.on('close', () => d.destroy());
  return { stream: d, push };
}
