// The floor of any Node.js PostgreSQL proxy, for bench:db: each client connection is piped to its own new
// server connection ('data' → write, both ways), with no parsing, pooling or admission. Whatever poolgate
// costs beyond this is poolgate's; what this costs beyond PgBouncer is Node.js's socket path.
// Run as a child (bench/lib/child.mjs): prints {"port":N} once listening. Args: upstream host, port.
import net from 'node:net';

const [host, port] = [process.argv[2] ?? '127.0.0.1', Number(process.argv[3] ?? 5432)];
const server = net.createServer({ noDelay: true }, (client) => {
  const upstream = net.connect({ host, port, noDelay: true });
  client.on('data', (d) => {
    if (!upstream.write(d)) client.pause();
  });
  upstream.on('drain', () => client.resume());
  upstream.on('data', (d) => {
    if (!client.write(d)) upstream.pause();
  });
  client.on('drain', () => upstream.resume());
  client.on('close', () => upstream.destroy());
  upstream.on('close', () => client.destroy());
  client.on('error', () => {});
  upstream.on('error', () => {});
});
server.listen(0, '127.0.0.1', () => process.stdout.write(`${JSON.stringify({ port: server.address().port })}\n`));
