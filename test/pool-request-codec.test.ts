// Issue 29 §2: the pool request core owns its interface (src/pool-request/codec.ts): a request body arrives as
// Buffers with end-of-stream, and a response goes out through an encoder that takes each chunk whole and reports
// backpressure by its return value and a drain callback. node:http is the first-class implementation: its body
// Buffers reach the core as node delivered them, with no copy; the uWS adapter gives the same contract (where its
// native build loads: Node 20).
import t, { type Test } from 'tap';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { request } from 'undici';
import { EMPTY, type BodySource, type ResponseEncoder } from '../src/pool-request/codec.js';
import { NodeResponseEncoder, nodeBodySource, readNodeHeaders } from '../src/pool-request/node-http.js';
import { RequestBody } from '../src/pool-request/request-body.js';
import { uwsLoads, loadUws } from '../src/http/uws/load.js';
import { UwsResponseEncoder } from '../src/http/uws/response.js';
import { uwsBodySource } from '../src/http/uws/request.js';

/** A node:http server whose handler is `handle`; closed at the end of the test. */
async function nodeServer(t: Test, handle: (req: IncomingMessage, res: ServerResponse) => void): Promise<string> {
  const server = createServer(handle);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

const BIG = 8 * 1024 * 1024;
const bigBody = (): Buffer => {
  const b = Buffer.alloc(BIG);
  for (let i = 0; i < BIG; i += 4096) b[i] = (i / 4096) & 0xff;
  return b;
};

t.test("node:http: the body reaches the core as node's own Buffers, then end-of-stream, and RequestBody streams them uncopied", async (t) => {
  let emitted: Buffer[] = [];
  let received: Array<{ chunk: Buffer; end: boolean }> = [];
  let streamed: Buffer[] = [];
  const done = new Promise<void>((resolve) => {
    void nodeServer(t, (req, res) => {
      emitted = [];
      req.on('data', (b: Buffer) => emitted.push(b));
      const source: BodySource = nodeBodySource(req, res, false);
      const client = new NodeResponseEncoder(req, res, false);
      // The core's reader over the same source: what it streams on are the chunks it was handed.
      const body = new RequestBody(client, (h) => source((chunk, end) => {
        received.push({ chunk, end });
        h(chunk, end);
      }), null);
      body.on('data', (b: Buffer) => streamed.push(b));
      body.on('end', () => {
        client.encodeHeaders(200, [['content-type', 'text/plain']], 2);
        client.encodeData(Buffer.from('ok'), true);
        resolve();
      });
    }).then((url) => {
      const payload = Buffer.alloc(300 * 1024, 7);
      return request(url, { method: 'POST', body: payload, headers: { 'content-length': String(payload.length) } }).then((r) => r.body.text());
    });
  });
  await done;
  const data = received.filter((r) => r.chunk.length > 0);
  t.ok(data.length > 0, 'chunks arrived');
  t.ok(
    data.every((r, i) => Buffer.isBuffer(r.chunk) && r.chunk === emitted[i]),
    "every chunk is the very Buffer node:http emitted (no copy on the way in)",
  );
  t.same(received.at(-1), { chunk: EMPTY, end: true }, 'the body ends with end-of-stream');
  t.equal(received.filter((r) => r.end).length, 1, 'end-of-stream once');
  t.ok(streamed.length > 0 && streamed.every((b, i) => b === emitted[i]), 'RequestBody streams the same Buffers on');
  t.equal(Buffer.concat(streamed).length, 300 * 1024);
});

/** Writes `body` through `client` as the forward stage does: headers, chunks while it may, the rest after each drain. */
function writeThrough(client: ResponseEncoder, body: Buffer, length: number | null, events: string[], flat = false): void {
  const CHUNK = 1024 * 1024;
  let at = 0;
  // The forward stage hands its head over flat (encodeHeadersFlat); other callers give pairs.
  if (flat) client.encodeHeadersFlat(200, ['content-type', 'application/octet-stream', 'x-head', 'flat'], length);
  else client.encodeHeaders(200, [['content-type', 'application/octet-stream']], length);
  const pump = (): void => {
    while (at < body.length) {
      const end = at + CHUNK >= body.length;
      const ok = client.encodeData(body.subarray(at, at + CHUNK), end && length !== null);
      at += CHUNK;
      if (end) break;
      if (!ok) {
        events.push('backpressure');
        return;
      }
    }
    if (length === null) client.encodeData(EMPTY, true);
    events.push('ended');
  };
  client.onWritable(() => {
    events.push('drained');
    pump();
  });
  pump();
}

for (const [length, flat] of [['content-length', false], ['chunked', false], ['content-length', true], ['chunked', true]] as const) {
  t.test(`node:http encoder, ${length}${flat ? ', flat head' : ''}: each chunk is taken whole, backpressure is reported and lifted by the drain callback`, async (t) => {
    const body = bigBody();
    const events: string[] = [];
    const url = await nodeServer(t, (req, res) => writeThrough(new NodeResponseEncoder(req, res, false), body, length === 'chunked' ? null : body.length, events, flat));
    const r = await request(url);
    // Read slowly at first so the server's socket backs up.
    const parts: Buffer[] = [];
    for await (const p of r.body) {
      parts.push(p as Buffer);
      if (parts.length === 1) await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const got = Buffer.concat(parts);
    t.ok(got.equals(body), 'every byte, in order');
    if (length === 'chunked') t.equal(r.headers['transfer-encoding'], 'chunked');
    else t.equal(r.headers['content-length'], String(body.length));
    t.equal(r.headers['content-type'], 'application/octet-stream');
    if (flat) t.equal(r.headers['x-head'], 'flat', 'a flat head is written as given');
    t.ok(events.includes('backpressure') && events.includes('drained'), `backpressure was reported and lifted (${events.join(' ')})`);
    t.equal(events.at(-1), 'ended');
  });
}

t.test('uWS encoder: the same contract over tryEnd (a Content-Length chunk uWS takes in part is finished by the adapter)', { skip: uwsLoads() ? false : 'the native uWebSockets.js build does not load on this Node' }, async (t) => {
  const uws = loadUws();
  const app = uws.App();
  const body = bigBody();
  const events: Record<string, string[]> = { cl: [], chunked: [] };
  let echoed: Buffer[] = [];
  app.get('/cl', (res) => writeThrough(new UwsResponseEncoder(res, false), body, body.length, events.cl!));
  app.get('/chunked', (res) => writeThrough(new UwsResponseEncoder(res, false), body, null, events.chunked!, true));
  app.post('/echo', (res) => {
    const client = new UwsResponseEncoder(res, false);
    echoed = [];
    uwsBodySource(res)((chunk, end) => {
      if (chunk.length > 0) echoed.push(chunk);
      if (end) {
        const n = Buffer.byteLength(String(Buffer.concat(echoed).length));
        client.encodeHeaders(200, [], n);
        client.encodeData(Buffer.from(String(Buffer.concat(echoed).length)), true);
      }
    });
  });
  const port = await new Promise<number>((resolve) => app.listen('127.0.0.1', 0, (s) => resolve(uws.us_socket_local_port(s))));
  t.teardown(() => (app as unknown as { close(): void }).close());
  for (const path of ['cl', 'chunked'] as const) {
    const r = await request(`http://127.0.0.1:${port}/${path}`);
    const parts: Buffer[] = [];
    for await (const p of r.body) {
      parts.push(p as Buffer);
      if (parts.length === 1) await new Promise((resolve) => setTimeout(resolve, 100));
    }
    t.ok(Buffer.concat(parts).equals(body), `${path}: every byte, in order`);
    t.ok(events[path]!.includes('backpressure'), `${path}: backpressure was reported (${events[path]!.join(' ')})`);
    t.equal(events[path]!.at(-1), 'ended');
  }
  const r = await request(`http://127.0.0.1:${port}/echo`, { method: 'POST', body: Buffer.alloc(200 * 1024, 1) });
  t.equal(await r.body.text(), String(200 * 1024), 'the body arrived as Buffers (copied once: uWS reuses its memory)');
  t.ok(echoed.every((b) => Buffer.isBuffer(b)));
});

t.test('the header record: names lower-cased, a repeated header joined with ", " in order, no prototype', async (t) => {
  const h = readNodeHeaders(['Accept', 'a/b', 'X-Tag', '1', 'accept', 'c/d', 'x-tag', '2', '__proto__', 'p', 'Constructor', 'q']);
  t.equal(Object.getPrototypeOf(h), null);
  t.same(Object.keys(h), ['accept', 'x-tag', '__proto__', 'constructor']);
  t.equal(h.accept, 'a/b, c/d');
  t.equal(h['x-tag'], '1, 2');
  t.equal(h['__proto__'], 'p');
  t.equal(h.constructor, 'q');
  t.equal(h.toString, undefined, 'nothing inherited reads as a header');
});
