// The PostgreSQL listener writes its connections through the socket handle (src/db/direct-writes.ts). What it
// relies on: every byte arrives once and in order, a write the kernel cannot take at once answers false and
// is followed by the socket's 'drain', writes mixed with socket.write and end() stay in order, the socket still
// counts the bytes. (TLS sockets, written through socket.write, are covered by the pgwire TLS tests.)
import t, { type Test } from 'tap';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { createServer, connect, type AddressInfo, type Socket } from 'node:net';
import { DirectWriter } from '../src/db/direct-writes.js';

/** A peer that reads nothing until `read()`, then collects every byte until the connection ends. */
async function slowPeer(t: Test): Promise<{ port: number; received: Promise<Buffer>; read(): void }> {
  let accepted: Socket | null = null;
  let ended: (b: Buffer) => void = () => {};
  const received = new Promise<Buffer>((r) => (ended = r));
  // Accepted paused: a 'data' listener does not start reading until resume().
  const server = createServer({ pauseOnConnect: true }, (s) => {
    accepted = s;
    const parts: Buffer[] = [];
    s.on('data', (d: Buffer) => parts.push(d));
    s.on('end', () => ended(Buffer.concat(parts)));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => {
    (accepted as Socket | null)?.destroy();
    return new Promise<void>((r) => server.close(() => r()));
  });
  return { port: (server.address() as AddressInfo).port, received, read: () => accepted!.resume() };
}

t.test('bytes arrive whole and in order; a write the kernel cannot take answers false, then drain', async (t) => {
  const peer = await slowPeer(t);
  const s = connect(peer.port, '127.0.0.1');
  await once(s, 'connect');
  const w = new DirectWriter(s);
  const data = randomBytes(16 * 1024 * 1024);
  let refused = 0;
  let at = 0;
  // While the peer reads nothing the socket buffers fill: some write must answer false.
  while (at < data.length && refused === 0) {
    if (!w.write(data.subarray(at, at + 65_536))) refused++;
    at += 65_536;
  }
  t.equal(refused, 1, 'a write the kernel could not take at once answered false');
  t.ok(w.needDrain, 'the writer says it waits');
  const drained = once(s, 'drain');
  peer.read();
  await drained;
  t.notOk(w.needDrain, 'drain came once the write was done');
  // The rest mixes direct writes with the socket's own write and end: the order must hold.
  for (; at < data.length - 65_536; at += 65_536) if (!w.write(data.subarray(at, at + 65_536))) await once(s, 'drain');
  s.end(data.subarray(at));
  const got = await peer.received;
  t.equal(got.length, data.length, 'every byte arrived once');
  t.ok(got.equals(data), 'in order');
  t.equal(s.bytesWritten, data.length, 'the socket counts the bytes of both paths');
});

t.test('a write after the connection is gone is refused as socket.write refuses it', async (t) => {
  const peer = await slowPeer(t);
  const s = connect(peer.port, '127.0.0.1');
  await once(s, 'connect');
  s.on('error', () => {});
  const w = new DirectWriter(s);
  s.destroy();
  t.equal(w.write(Buffer.from('late')), false, 'false, and nothing thrown');
});
