// The wire listeners read their connections through net.Socket's `onread` (src/db/direct-reads.ts): the
// connection's handle moves to a Socket that reads into memory of ours. What the listeners rely on: every
// byte arrives once and in order, a chunk kept (queued frames, writes still pending) is never overwritten
// by a later read, pause() stops reading, the end of the connection closes the socket, and anything that
// cannot be taken over (TLS) is read through `data` events instead.
import t, { type Test } from 'tap';
import { randomBytes } from 'node:crypto';
import { readFileSync, rmSync } from 'node:fs';
import { once } from 'node:events';
import { createServer, connect, type AddressInfo, type Server, type Socket } from 'node:net';
import { connect as tlsConnect, createServer as createTlsServer, type TLSSocket } from 'node:tls';
import { directReads } from '../src/db/direct-reads.js';
import { selfSignedCert } from './helpers/origin.js';

/** A listener whose accepted sockets are handed over paused, as the wire listeners accept them. */
async function pausedListener(t: Test, onSocket: (s: Socket) => void): Promise<{ server: Server; port: number }> {
  const server = createServer({ pauseOnConnect: true }, onSocket);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  return { server, port: (server.address() as AddressInfo).port };
}

/** Writes `data` in pieces of random size, yielding between them so they arrive as many reads. */
async function writeInPieces(s: Socket, data: Buffer): Promise<void> {
  for (let at = 0; at < data.length; ) {
    const n = Math.min(data.length - at, 1 + Math.floor(Math.random() * 20_000));
    if (!s.write(data.subarray(at, at + n))) await once(s, 'drain');
    at += n;
    if (Math.random() < 0.5) await new Promise((r) => setImmediate(r));
  }
}

t.test('an accepted connection is read through the callback: every chunk kept stays intact', async (t) => {
  const data = randomBytes(3 * 1024 * 1024);
  const kept: Buffer[] = [];
  let moved: Socket | null = null;
  let original: Socket | null = null;
  const closed = new Promise<void>((resolve) => {
    void pausedListener(t, (s) => {
      original = s;
      moved = directReads(s, (chunk) => kept.push(chunk));
      moved.on('close', () => resolve());
    }).then(async ({ port }) => {
      const c = connect(port, '127.0.0.1');
      await once(c, 'connect');
      await writeInPieces(c, data);
      c.end();
    });
  });
  await closed;
  t.not(moved, original, 'the reads were taken over: a new Socket on the same connection');
  t.equal(moved!.listenerCount('data'), 0, 'no data events are used');
  t.ok(kept.length > 3 * 1024 * 1024 / (16 * 1024), `many reads (${kept.length}), so many slabs were used`);
  // A slab written again by a later read would corrupt an earlier chunk kept here.
  t.ok(Buffer.concat(kept).equals(data), 'the kept chunks are the bytes sent, in order');
});

t.test('a connected socket that was read with data events is taken over in place; writes still work', async (t) => {
  const { port } = await pausedListener(t, (s) => {
    const echo = directReads(s, (chunk) => echo.write(chunk));
    echo.on('end', () => echo.end());
  });
  const c = connect(port, '127.0.0.1');
  // Read with data events first, as node-postgres does during its login, then hand the socket over.
  const [hello] = await Promise.all([once(c, 'data'), c.write('hello')]);
  t.equal(String(hello), 'hello');
  c.removeAllListeners('data');
  const got: Buffer[] = [];
  const direct = directReads(c, (chunk) => got.push(chunk));
  t.not(direct, c);
  const data = randomBytes(512 * 1024);
  await writeInPieces(direct, data);
  direct.end();
  await once(direct, 'close');
  t.ok(Buffer.concat(got).equals(data), 'the echo came back whole');
});

t.test('pause() stops reading until resume(); the end of the connection closes the socket', async (t) => {
  // Small enough to sit whole in the kernel's buffers while nothing reads it, so the sender can finish.
  const size = 32 * 1024;
  let got = 0;
  let socket!: Socket;
  let witnessRead!: () => void;
  const witnessSeen = new Promise<void>((r) => (witnessRead = r));
  let accepted = 0;
  const { port } = await pausedListener(t, (s) => {
    if (accepted++ === 0) {
      socket = directReads(s, (chunk) => {
        got += chunk.length;
      });
      socket.pause();
    } else {
      // A second connection, not paused: its byte is read only after the event loop polled the sockets
      // with the paused one's bytes already waiting, so a read of those would have come first.
      const w = directReads(s, () => witnessRead());
      t.teardown(() => w.destroy());
    }
  });
  const c = connect(port, '127.0.0.1');
  c.end(Buffer.alloc(size, 1));
  await once(c, 'finish'); // every byte handed to the kernel
  const witness = connect(port, '127.0.0.1');
  t.teardown(() => witness.destroy());
  witness.write('x');
  await witnessSeen;
  t.equal(got, 0, 'nothing is read while paused');
  const closed = once(socket, 'close');
  socket.resume();
  await closed;
  t.equal(got, size, 'everything is read after resume, then the end closes the socket');
});

t.test('a TLS socket is not taken over: it is read through data events', async (t) => {
  const { dir, certFile, keyFile } = selfSignedCert();
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const server = createTlsServer({ cert: readFileSync(certFile), key: readFileSync(keyFile) }, (s) => s.end('over tls'));
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const c: TLSSocket = tlsConnect({ port: (server.address() as AddressInfo).port, host: '127.0.0.1', rejectUnauthorized: false });
  await once(c, 'secureConnect');
  const got: Buffer[] = [];
  const same = directReads(c, (chunk) => got.push(chunk));
  t.equal(same, c, 'the same socket');
  await once(c, 'close');
  t.equal(Buffer.concat(got).toString(), 'over tls');
});

t.test('a server whose taken-over connections were destroyed closes', async (t) => {
  const sockets: Socket[] = [];
  const { server, port } = await pausedListener(t, (s) => sockets.push(directReads(s, () => {})));
  const clients = [connect(port, '127.0.0.1'), connect(port, '127.0.0.1')];
  await Promise.all(clients.map((c) => once(c, 'connect')));
  while (sockets.length < 2) await new Promise((r) => setImmediate(r));
  for (const s of sockets) s.destroy();
  await Promise.all(clients.map((c) => once(c, 'close')));
  await new Promise<void>((resolve) => server.close(() => resolve()));
  t.pass('closed');
});
