// Reads a small request body off node:http into one Buffer, refusing it as soon as it passes the limit.
import type { IncomingMessage } from 'node:http';
import type { BodyLimit } from '../pool-request/body-limit.js';
import type { ClientSide } from '../pool-request/client-response.js';

export type BodyResult = { ok: true; body: Buffer } | { ok: false; reason: 'too_large' | 'aborted' };

export function readBody(req: IncomingMessage, client: ClientSide, limit: BodyLimit): Promise<BodyResult> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    const finish = (r: BodyResult) => {
      if (done) return;
      done = true;
      req.off('data', onData);
      resolve(r);
    };
    const onData = (chunk: Buffer) => {
      size += chunk.byteLength;
      // The rest is never read: the 413 closes the connection.
      if (limit.over(size)) return finish({ ok: false, reason: 'too_large' });
      chunks.push(chunk);
    };
    client.onAbort(() => finish({ ok: false, reason: 'aborted' }));
    req.on('data', onData);
    req.once('end', () => finish({ ok: true, body: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks) }));
  });
}
