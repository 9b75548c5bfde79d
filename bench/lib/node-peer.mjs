// The Node.js proxy a user would otherwise pick: fastify + @fastify/http-proxy (undici underneath) in front
// of the https origin. Run as a child: node node-peer.mjs <upstream> <caFile>; prints {"port":N}.
import { readFileSync } from 'node:fs';
import Fastify from 'fastify';
import proxy from '@fastify/http-proxy';

const [upstream, caFile] = process.argv.slice(2);
const app = Fastify({ logger: false });
await app.register(proxy, {
  upstream,
  http2: false,
  undici: { connections: 128, pipelining: 1, keepAliveTimeout: 30_000, connect: { ca: readFileSync(caFile, 'utf8') } },
});
await app.listen({ host: '127.0.0.1', port: 0 });
console.log(JSON.stringify({ port: app.server.address().port }));
process.on('SIGTERM', () => void app.close().then(() => process.exit(0)));
