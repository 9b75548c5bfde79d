// Issue 25 items 3–6 through the proxy port with raw sockets and origins that record what reaches them (items 1,
// 2 and 7 are corpus cases: test/front-door-conformance.test.ts; item 8: test/front-door-abort-load.test.ts).
//   3: `_method` in the query or a form body is judged for a read key as the override headers are.
//   4: a declared body that stops arriving holds no slot and is answered 408 after the body timeout.
//   5: a chunked body that breaks off after its first chunk never reaches the origin.
//   6: an unsolicited `100 Continue` from the origin is dropped and the final response answered.
import t from 'tap';
import { connect, createServer, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { until } from './helpers/until.js';
import { startTestService, type TestService } from './helpers/service.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';

// Long enough that a prompt answer on a loaded 2-core machine comes in well before it.
const BODY_TIMEOUT_MS = 1500;
let origin: Origin;
let svc: TestService;
let readKey = '';
let writeKey = '';
let poolId = 0;
let interim: Server;
let interimPort = 0;

/** An origin speaking raw HTTP/1.1: `/split` sends `100 Continue`, then the answer 30 ms later; `/joined` both in one write. */
function startInterimOrigin(): Promise<void> {
  interim = createServer((s: Socket) => {
    let buf = '';
    s.on('data', (c: Buffer) => {
      buf += c.toString('latin1');
      let end: number;
      while ((end = buf.indexOf('\r\n\r\n')) !== -1) {
        const head = buf.slice(0, end);
        buf = buf.slice(end + 4);
        const answer = 'HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\nfinal';
        if (head.includes(' /joined ')) s.write(`HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\nx-a: b\r\n\r\n${answer}`);
        else {
          s.write('HTTP/1.1 100 Continue\r\n\r\n');
          setTimeout(() => s.write(answer), 30);
        }
      }
    });
    s.on('error', () => {});
  });
  return new Promise((resolve) => interim.listen(0, '127.0.0.1', () => {
    interimPort = (interim.address() as AddressInfo).port;
    resolve();
  }));
}

t.before(async () => {
  origin = await startOrigin();
  await startInterimOrigin();
  delete process.env.TEST_PROXY_HTTP_PARSER;
  svc = await startTestService({ overrides: { originCaFile: origin.caFile, proxyBodyTimeoutMs: BODY_TIMEOUT_MS } });
  const boot = await svc.bootstrap();
  const sql = svc.service.sql;
  const settings = { readMethods: ['POST'], queueTimeoutMs: 5000 };
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, 'round2', 'round2', 'http', $2, $3, 1, true, $4::jsonb) RETURNING id`,
    [boot.team.id, origin.url, new URL(origin.url).host, JSON.stringify(settings)],
  );
  poolId = rows[0]!.id;
  await sql.notify(CHANGE_CHANNEL, `pool:${poolId}`);
  const r2 = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, 'interim', 'interim', 'http', $2, $3, 2, false, '{}'::jsonb) RETURNING id`,
    [boot.team.id, `http://127.0.0.1:${interimPort}`, `127.0.0.1:${interimPort}`],
  );
  await sql.notify(CHANGE_CHANNEL, `pool:${r2.rows[0]!.id}`);
  const mint = async (access: string) => {
    const r = await svc.api('POST', '/api/v1/pools/round2/keys', { token: boot.token, body: { access } });
    return r.body.data.key as string;
  };
  readKey = await mint('read');
  writeKey = await mint('write');
  await svc.service.dataplane!.snapshots.reload();
});
t.teardown(async () => {
  await svc?.close();
  await origin?.close();
  await new Promise((r) => interim?.close(r));
});

interface Answer {
  status: number;
  body: string;
  closed: boolean;
  /** ms from the write to the answer (or the close). */
  ms: number;
}

/** Writes `text` on a fresh connection; resolves once one whole answer (with a Content-Length) is in, or on close. */
function send(text: string | Buffer, opts: { port?: number; keepOpenMs?: number } = {}): Promise<Answer> {
  return new Promise((resolve) => {
    const started = performance.now();
    const sock = connect(opts.port ?? svc.service.ports.proxy!, '127.0.0.1', () => sock.write(text));
    let got = '';
    let done = false;
    const finish = (closed: boolean) => {
      if (done) return;
      done = true;
      const head = got.indexOf('\r\n\r\n');
      const finals = [...got.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1])).filter((s) => s >= 200);
      resolve({ status: finals[0] ?? 0, body: head === -1 ? '' : got.slice(got.lastIndexOf('\r\n\r\n') + 4), closed, ms: performance.now() - started });
      sock.destroy();
    };
    sock.on('data', (c: Buffer) => {
      got += c.toString('latin1');
      // The last head's Content-Length frames the answer (interim 1xx heads carry none).
      const last = got.lastIndexOf('\r\n\r\n');
      const len = /content-length: (\d+)/gi;
      let n: RegExpExecArray | null;
      let length = -1;
      while ((n = len.exec(got)) !== null) length = Number(n[1]);
      if (length >= 0 && last !== -1 && got.length - last - 4 >= length) {
        // An answer that announces its close (Connection: close) is followed by it: wait for the close itself
        // (the end/close handlers below), within 5 s more, not for a fixed moment a loaded machine may overrun.
        const head = got.slice(got.lastIndexOf('HTTP/1.1 ', last), last);
        if (/\r\nconnection: *close\r?$/im.test(head)) setTimeout(() => finish(sock.destroyed || sock.readableEnded), 5000);
        // Any other answer keeps the connection: a close that comes anyway within a moment is still seen.
        else setTimeout(() => finish(sock.destroyed || sock.readableEnded), 50);
      }
    });
    // No answer within 5 s counts as none (a test must fail, not hang, without the code it covers).
    setTimeout(() => finish(false), 5000);
    sock.on('end', () => finish(true));
    sock.on('close', () => finish(true));
    sock.on('error', () => {});
  });
}

const post = (target: string, key: string, type: string, body: string) =>
  `POST ${target} HTTP/1.1\r\nHost: round2.pools.localhost\r\nX-Service-Key: ${key}\r\nContent-Type: ${type}\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
const FORM = 'application/x-www-form-urlencoded';
const multipart = (name: string, value: string) =>
  `--b0\r\nContent-Disposition: form-data; name="q"\r\n\r\nx\r\n--b0\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n--b0--\r\n`;

t.test('item 3: _method in the query or a form body is judged for a read key as the override headers are', async (t) => {
  const refused: Array<[string, string]> = [
    ['query', post('/q?_method=DELETE', readKey, 'application/json', '{}')],
    ['query, lower case value', post('/q?a=1&_method=delete', readKey, 'application/json', '{}')],
    ['query, escaped name', post('/q?%5Fmethod=DELETE', readKey, 'application/json', '{}')],
    ['query, name PHP reads as _method', post('/q?.method=DELETE', readKey, 'application/json', '{}')],
    ['query, on a GET too', `GET /q?_method=DELETE HTTP/1.1\r\nHost: round2.pools.localhost\r\nX-Service-Key: ${readKey}\r\n\r\n`],
    ['urlencoded form', post('/q', readKey, FORM, 'a=1&_method=DELETE')],
    ['urlencoded form, escaped', post('/q', readKey, `${FORM}; charset=utf-8`, 'a=1&%5fmethod=PUT')],
    ['multipart form', post('/q', readKey, 'multipart/form-data; boundary=b0', multipart('_method', 'DELETE'))],
  ];
  origin.reset();
  for (const [name, text] of refused) {
    const a = await send(text);
    t.equal(a.status, 403, `${name}: 403`);
    // A form is judged once read whole: its connection goes on. A query refusal leaves the body unread: closed.
    if (name.includes('form')) t.notOk(a.closed, `${name}: the body was read, the connection stays open`);
  }
  t.equal(origin.count, 0, 'none of them reached the origin');

  const admitted: Array<[string, string, string]> = [
    ['a read key, _method naming a method it may send', post('/ok1?_method=POST', readKey, 'application/json', '{}'), '/ok1?_method=POST'],
    ['a read key, a form without _method', post('/ok2', readKey, FORM, 'a=1&method=x'), '/ok2'],
    ['a read key, a multipart form without _method', post('/ok3', readKey, 'multipart/form-data; boundary=b0', multipart('other', 'DELETE')), '/ok3'],
    ['a write key may override', post('/ok4?_method=DELETE', writeKey, FORM, '_method=DELETE'), '/ok4?_method=DELETE'],
  ];
  for (const [name, text, url] of admitted) {
    const a = await send(text);
    t.equal(a.status, 200, `${name}: 200`);
    t.ok(origin.requests.some((r) => r.url === url), `${name}: the origin saw ${url}`);
  }
  const big = await send(post('/big', readKey, FORM, `a=${'x'.repeat(70 * 1024)}`));
  t.equal(big.status, 413, "a read key's form body over 64 KiB cannot be judged: 413");
  t.notOk(origin.requests.some((r) => r.url === '/big'), 'and the origin saw nothing of it');
});

t.test('item 4: a declared body that never arrives holds no slot, and is answered 408 after the body timeout', async (t) => {
  const dp = svc.service.dataplane!;
  origin.reset();
  // Content-Length 500,000,000, ten bytes, then silence; the pool has one slot.
  const stalled = send(
    `POST /stall HTTP/1.1\r\nHost: round2.pools.localhost\r\nX-Service-Key: ${writeKey}\r\nContent-Length: 500000000\r\n\r\n0123456789`,
  );
  await until('the stalled request in the data plane', () => dp.inFlight === 1);
  t.equal(dp.governor.state(poolId).inFlight, 0, 'the stalled body holds no slot');
  const other = await send(`GET /meanwhile HTTP/1.1\r\nHost: round2.pools.localhost\r\nX-Service-Key: ${writeKey}\r\n\r\n`);
  t.equal(other.status, 200, "another request gets the pool's one slot at once");
  t.ok(other.ms < BODY_TIMEOUT_MS, `without waiting for the stalled one (${Math.round(other.ms)} ms)`);
  const a = await stalled;
  t.equal(a.status, 408, 'the stalled request is answered 408');
  t.ok(a.closed, 'and its connection closed');
  t.ok(a.ms >= BODY_TIMEOUT_MS - 50 && a.ms < BODY_TIMEOUT_MS + 2000, `after the body timeout (${Math.round(a.ms)} ms, timeout ${BODY_TIMEOUT_MS})`);
  t.same(origin.requests.map((r) => r.url), ['/meanwhile'], 'the origin saw only the other request');
  t.equal(origin.count, 1);

  // A large body that stalls after its first 64 KiB is streamed, so it holds a slot: the body timeout ends it.
  origin.reset();
  const big = send(
    Buffer.concat([
      Buffer.from(`POST /stall-big HTTP/1.1\r\nHost: round2.pools.localhost\r\nX-Service-Key: ${writeKey}\r\nContent-Length: 500000\r\n\r\n`),
      Buffer.alloc(100 * 1024, 0x61),
    ]),
  );
  const b = await big;
  t.equal(b.status, 408, 'a large body that stalls mid-stream is answered 408 too');
  t.ok(b.closed, 'and its connection closed');
  await until('the stalled slot to be free', () => dp.governor.state(poolId).inFlight === 0);
  t.equal(dp.governor.state(poolId).inFlight, 0, 'its slot is free again');
});

t.test('item 5: a chunked body that breaks off after its first chunk never reaches the origin', async (t) => {
  const dp = svc.service.dataplane!;
  origin.reset();
  await new Promise<void>((resolve) => {
    const sock = connect(svc.service.ports.proxy!, '127.0.0.1', () => {
      sock.write(`POST /broken HTTP/1.1\r\nHost: round2.pools.localhost\r\nX-Service-Key: ${writeKey}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n`);
      setTimeout(() => {
        sock.destroy();
        resolve();
      }, 100);
    });
    sock.on('error', () => {});
  });
  await until('the request to settle', () => dp.inFlight === 0);
  // The positive signal: a request sent through the proxy after the broken one settled reaches the origin;
  // anything the proxy had sent for the broken one was on its way before it, so the origin has it by now.
  const after = await send(`GET /after HTTP/1.1\r\nHost: round2.pools.localhost\r\nX-Service-Key: ${writeKey}\r\n\r\n`);
  t.equal(after.status, 200, 'a later request is proxied');
  t.same(origin.requests.map((r) => r.url), ['/after'], 'the origin saw nothing of the broken one: not the head, not the chunk');
  t.equal(dp.inFlight, 0, 'the request is settled');
  t.equal(dp.governor.state(poolId).inFlight, 0, 'no slot held');
});

t.test('item 6: an unsolicited 100 Continue from the origin is dropped, and the final response answered', async (t) => {
  for (const path of ['/split', '/joined']) {
    const a = await send(`GET ${path} HTTP/1.1\r\nHost: interim.pools.localhost\r\n\r\n`);
    t.equal(a.status, 200, `${path}: the final 200, not a 502`);
    t.equal(a.body, 'final', `${path}: its body`);
    t.notOk(a.closed, `${path}: the connection stays open`);
  }
  // Several in a row on one kept-alive origin connection.
  for (let i = 0; i < 3; i++) t.equal((await send(`GET /split HTTP/1.1\r\nHost: interim.pools.localhost\r\n\r\n`)).status, 200, `again (${i + 1})`);
});
