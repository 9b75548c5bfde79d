// The Node floor (issue 29): the least a Node.js proxy can do — node:http in front, one undici Pool of
// keep-alive https connections to the origin behind, the answer's status, content-type and body passed back,
// and nothing else (no routing, auth, admission, logging). What poolgate's data plane is measured against on
// the same machine in the same run, since absolute rates do not carry between machines (issue 28 item 5).
// Run as a child: node node-floor.mjs <origin> <caFile>; prints {"port":N}.
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { Pool } from 'undici';

const [origin, caFile] = process.argv.slice(2);
const upstream = new URL(origin);
const pool = new Pool(upstream.origin, {
  connections: 128,
  pipelining: 1,
  keepAliveTimeout: 30_000,
  connect: { ca: readFileSync(caFile, 'utf8') },
});

// undici's stream(): the answer's body is written straight into the client's response (no Readable per request),
// the fastest way undici offers to pass a body on.
const server = createServer((req, res) => {
  pool
    .stream({ path: req.url, method: req.method, body: req.method === 'GET' || req.method === 'HEAD' ? null : req, opaque: res }, ({ statusCode, headers, opaque }) => {
      const head = {};
      if (headers['content-type']) head['content-type'] = headers['content-type'];
      if (headers['content-length']) head['content-length'] = headers['content-length'];
      opaque.writeHead(statusCode, head);
      return opaque;
    })
    .catch((err) => {
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' }).end(`upstream: ${err.code ?? err.message}\n`);
      else res.destroy(err);
    });
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => console.log(JSON.stringify({ port: server.address().port })));
process.on('SIGTERM', () => {
  server.closeAllConnections();
  server.close(() => void pool.close().then(() => process.exit(0)));
});
