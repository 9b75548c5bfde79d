// Reads a small request body from the front door into one Buffer, refusing it as soon as it passes the limit.
import type { BodyLimit } from '../pool-request/body-limit.js';
import type { BodySource, ResponseEncoder } from '../pool-request/codec.js';

export type BodyResult = { ok: true; body: Buffer } | { ok: false; reason: 'too_large' | 'aborted' };

export function readBody(source: BodySource, client: ResponseEncoder, limit: BodyLimit): Promise<BodyResult> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    const finish = (r: BodyResult) => {
      if (done) return;
      done = true;
      resolve(r);
    };
    client.onAbort(() => finish({ ok: false, reason: 'aborted' }));
    source((chunk, end) => {
      if (done) return;
      size += chunk.byteLength;
      // The rest is never read: the 413 closes the connection.
      if (limit.over(size)) return finish({ ok: false, reason: 'too_large' });
      if (chunk.byteLength > 0) chunks.push(chunk);
      if (end) finish({ ok: true, body: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks) });
    });
  });
}
