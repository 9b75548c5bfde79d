// The benchmark's origin: an https server on a loopback address, answering every request with one small fixed
// JSON body, so the proxy in front of it is what the figures measure. uWS's SSLApp where its native build loads
// (Node 20); elsewhere (Node 24, where the unofficial build falls back to pure JS without SSLApp) node:https.
// Run as a child: node tls-origin.mjs <host> <keyFile> <certFile>; prints {"port":N,"server":"uws"|"node:https"}.
import { readFileSync } from 'node:fs';
import { createServer } from 'node:https';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const [host, keyFile, certFile] = process.argv.slice(2);
const BODY = JSON.stringify({ ok: true, service: 'origin', items: [1, 2, 3] });

let uws = null;
try {
  uws = require('uWebSockets.js');
  if (typeof uws.SSLApp !== 'function') uws = null;
} catch {
  uws = null;
}

if (uws) {
  const app = uws.SSLApp({ key_file_name: keyFile, cert_file_name: certFile });
  app.any('/*', (res) => {
    res.cork(() => {
      res.writeHeader('content-type', 'application/json');
      res.end(BODY);
    });
  });
  app.listen(host, 0, (socket) => {
    if (!socket) {
      console.error(`cannot listen on ${host}`);
      process.exit(1);
    }
    console.log(JSON.stringify({ port: uws.us_socket_local_port(socket), server: 'uws' }));
  });
} else {
  const server = createServer({ key: readFileSync(keyFile), cert: readFileSync(certFile) }, (req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(BODY) }).end(BODY);
  });
  server.keepAliveTimeout = 60_000;
  server.listen(0, host, () => console.log(JSON.stringify({ port: server.address().port, server: 'node:https' })));
}
process.on('SIGTERM', () => process.exit(0));
