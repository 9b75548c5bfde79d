// The benchmark's origin: uWS over TLS on a loopback address, answering every request with one small fixed
// JSON body, so the proxy in front of it is what the figures measure. Run as a child: node tls-origin.mjs
// <host> <keyFile> <certFile>; prints {"port":N}.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const uws = require('uWebSockets.js');
const [host, keyFile, certFile] = process.argv.slice(2);
const BODY = JSON.stringify({ ok: true, service: 'origin', items: [1, 2, 3] });

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
  console.log(JSON.stringify({ port: uws.us_socket_local_port(socket) }));
});
process.on('SIGTERM', () => process.exit(0));
