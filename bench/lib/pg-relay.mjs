// The floor of any Node.js PostgreSQL proxy, for bench:db: each client connection is piped to its own new
// server connection (read → write, both ways), with no parsing, pooling or admission. Both sides are read
// and written the way poolgate's listeners read and write (src/db/direct-reads.ts: net.Socket's onread, no
// Readable stream; src/db/direct-writes.ts: the handle's writeBuffer, no Writable), so whatever poolgate costs
// beyond this is poolgate's; what this costs beyond PgBouncer is Node.js's socket path.
// Run as a child (bench/lib/child.mjs): prints {"port":N} once listening. Args: upstream host, port.
// Needs the build (npm run bench:db builds first).
import net from 'node:net';
import { directReads } from '../../dist/src/db/direct-reads.js';
import { DirectWriter } from '../../dist/src/db/direct-writes.js';

const [host, port] = [process.argv[2] ?? '127.0.0.1', Number(process.argv[3] ?? 5432)];
const server = net.createServer({ noDelay: true, pauseOnConnect: true }, (accepted) => {
  let client = null;
  let upstream = null;
  let toClient = null;
  let toUpstream = null;
  const connecting = net.connect({ host, port, noDelay: true }, () => {
    upstream = directReads(connecting, (d) => {
      if (!toClient.write(d)) upstream.pause();
    });
    toUpstream = new DirectWriter(upstream);
    upstream.on('drain', () => client.resume());
    upstream.on('close', () => client.destroy());
    upstream.on('error', () => {});
    client = directReads(accepted, (d) => {
      if (!toUpstream.write(d)) client.pause();
    });
    toClient = new DirectWriter(client);
    client.on('drain', () => upstream.resume());
    client.on('close', () => upstream.destroy());
    client.on('error', () => {});
  });
  connecting.on('error', () => accepted.destroy());
  accepted.on('error', () => {});
});
server.listen(0, '127.0.0.1', () => process.stdout.write(`${JSON.stringify({ port: server.address().port })}\n`));
