// The benchmark's webhook receiver, run as its own process (bench/webhooks.mjs forks it) so its CPU time per
// delivery can be measured apart from the load generator's: https with keep-alive, answers 200 at once, and
// reports each request (job id, webhook id header, path, arrival time) to the parent in batches over IPC.
// argv: certFile keyFile
import { readFileSync } from 'node:fs';
import { createServer } from 'node:https';

const [certFile, keyFile] = process.argv.slice(2);
let batch = [];
const server = createServer({ key: readFileSync(keyFile), cert: readFileSync(certFile) }, (req, res) => {
  req.resume();
  req.on('end', () => {
    batch.push([req.headers['x-service-job-id'], req.headers['x-service-webhook-id'], req.url, performance.timeOrigin + performance.now()]);
    res.writeHead(200, { 'content-length': '2' }).end('ok');
  });
});
server.keepAliveTimeout = 60_000;
let connections = 0;
server.on('secureConnection', () => connections++);
setInterval(() => {
  if (batch.length === 0) return;
  process.send({ arrivals: batch, connections });
  batch = [];
}, 10).unref();
process.on('message', (m) => {
  if (m === 'stop') {
    server.closeAllConnections();
    server.close(() => process.exit(0));
  }
});
server.listen(0, '127.0.0.1', () => process.send({ port: server.address().port }));
