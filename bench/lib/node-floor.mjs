// The Node floor (issue 29): the least a Node.js proxy can do — node:http in front, one undici Pool of
// keep-alive https connections to the origin behind, the answer's status, content-type and body passed back,
// and nothing else (no routing, auth, admission, logging). What poolgate's data plane is measured against on
// the same machine in the same run, since absolute rates do not carry between machines (issue 28 item 5).
//
// With --obligations <access log file>: the floor plus what the spec obliges every proxied request to carry,
// written the plain way and nothing of poolgate's: every request header passed on (hop-by-hop ones dropped, Host
// and X-Forwarded-For/-Proto/-Host set), every response header passed back (hop-by-hop, Date and framing dropped)
// with the three X-Service-* headers added, and one access-log line per request in poolgate's JSON shape through
// pino's asynchronous file destination (its own 4 KiB buffering). It says what share of poolgate's cost over the
// floor those duties take by themselves, measured in the same run. Which headers are hop-by-hop is the spec's rule,
// taken from poolgate's one statement of it (src/pool-request/headers.ts), not a copy of its list.
// Needs the build (npm run bench:proxy builds first).
// Run as a child: node node-floor.mjs <origin> <caFile> [--obligations <file>]; prints {"port":N}.
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { pino } from 'pino';
import { Pool } from 'undici';
import { connectionListed, isHopByHop } from '../../dist/src/pool-request/headers.js';

const [origin, caFile, flag, logFile] = process.argv.slice(2);
const obligations = flag === '--obligations';
const upstream = new URL(origin);
const pool = new Pool(upstream.origin, {
  connections: 128,
  pipelining: 1,
  keepAliveTimeout: 30_000,
  connect: { ca: readFileSync(caFile, 'utf8') },
});

// undici's stream(): the answer's body is written straight into the client's response (no Readable per request),
// the fastest way undici offers to pass a body on.
function bare(req, res) {
  pool
    .stream({ path: req.url, method: req.method, body: req.method === 'GET' || req.method === 'HEAD' ? null : req, opaque: res }, ({ statusCode, headers, opaque }) => {
      const head = {};
      if (headers['content-type']) head['content-type'] = headers['content-type'];
      if (headers['content-length']) head['content-length'] = headers['content-length'];
      opaque.writeHead(statusCode, head);
      return opaque;
    })
    .catch((err) => failed(res, err));
}

function failed(res, err) {
  if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' }).end(`upstream: ${err.code ?? err.message}\n`);
  else res.destroy(err);
}

const log = obligations ? pino.destination({ dest: logFile, sync: false, minLength: 4096 }) : null;
let inFlight = 0;

function withObligations(req, res) {
  const started = performance.now();
  inFlight++;
  // From rawHeaders alone (req.headers would build a second record): Host and Connection first, then the rest.
  const raw = req.rawHeaders;
  const names = [];
  let host = '';
  let connection;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i].toLowerCase();
    names.push(name);
    if (name === 'host') host = raw[i + 1];
    else if (name === 'connection') connection = raw[i + 1];
  }
  const listed = connectionListed(connection);
  const headers = [];
  for (let i = 0; i < names.length; i++) {
    const name = names[i];
    if (isHopByHop(name, listed) || name === 'host' || name.startsWith('x-forwarded-') || name.startsWith('x-service-')) continue;
    headers.push(name, raw[2 * i + 1]);
  }
  headers.push('host', upstream.host, 'x-forwarded-for', req.socket.remoteAddress, 'x-forwarded-proto', 'http', 'x-forwarded-host', host);
  const upstreamStarted = performance.now();
  pool
    .stream({ path: req.url, method: req.method, headers, body: req.method === 'GET' || req.method === 'HEAD' ? null : req, opaque: res }, ({ statusCode, headers: got, opaque }) => {
      const head = [];
      const listedBack = connectionListed(got.connection);
      for (const name in got) {
        if (isHopByHop(name, listedBack) || name === 'date') continue;
        const v = got[name];
        if (Array.isArray(v)) for (const one of v) head.push(name, one);
        else head.push(name, v);
      }
      head.push('x-service-remaining-slots', String(10_000 - inFlight), 'x-service-effective-limit', '10000', 'x-service-queued-ms', '0');
      opaque.writeHead(statusCode, head);
      return opaque;
    })
    .then(() => {
      inFlight--;
      const now = performance.now();
      log.write(
        `{"level":30,"time":"${new Date().toISOString()}","log":"access","pool":"bench-proxy","method":${JSON.stringify(req.method)},"path":${JSON.stringify(req.url)},` +
          `"status":${res.statusCode},"outcome":"proxied","queuedMs":0,"upstreamMs":${now - upstreamStarted},"totalMs":${now - started},"keyId":1}\n`,
      );
    }, (err) => {
      inFlight--;
      failed(res, err);
    });
}

const server = createServer(obligations ? withObligations : bare);
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => console.log(JSON.stringify({ port: server.address().port })));
process.on('SIGTERM', () => {
  server.closeAllConnections();
  // The access log's buffered lines are written (its 'close') before the process goes.
  const logClosed = () => (log ? new Promise((resolve) => (log.once('close', resolve), log.end())) : undefined);
  server.close(() => void pool.close().then(logClosed).then(() => process.exit(0)));
});
