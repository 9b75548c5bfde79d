// Reads a small request body off uWS into one Buffer, refusing it as soon as it passes the limit.
import type { HttpResponse } from 'uWebSockets.js';
import type { BodyLimit } from '../pool-request/body-limit.js';
import type { ClientSide as ClientResponse } from '../pool-request/client-response.js';

export type BodyResult = { ok: true; body: Buffer } | { ok: false; reason: 'too_large' | 'aborted' };

/** Must be called synchronously in the uWS handler (uWS delivers the body only to a handler set there). */
export function readBody(res: HttpResponse, client: ClientResponse, limit: BodyLimit): Promise<BodyResult> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    client.onAbort(() => {
      if (done) return;
      done = true;
      resolve({ ok: false, reason: 'aborted' });
    });
    res.onData((chunk, isLast) => {
      if (done) return;
      size += chunk.byteLength;
      if (limit.over(size)) {
        done = true;
        resolve({ ok: false, reason: 'too_large' });
        return;
      }
      // uWS neuters the ArrayBuffer when this callback returns: copy it.
      if (chunk.byteLength > 0) chunks.push(Buffer.from(chunk.slice(0)));
      if (isLast) {
        done = true;
        resolve({ ok: true, body: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks) });
      }
    });
  });
}
