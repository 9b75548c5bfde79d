// Runs the framing corpus (test/helpers/http-corpus.ts) against nginx (reverse proxy to a recording origin) and
// against a bare node:http server (llhttp, the candidate strict parser), and prints a markdown table for
// docs/http-front-door.md. Usage: npx tsx scripts/front-door-corpus.ts  (needs `nginx` on PATH). nginx
// refuses a wrong X-Service-Key with 401 (`if ... return 401`), as poolgate refuses a wrong key.
import { spawn } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { mkdtempSync, writeFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CORPUS, sendRaw, type RawResult } from '../test/helpers/http-corpus.js';

function listen(server: Server): Promise<number> {
  return new Promise((r) => server.listen(0, '127.0.0.1', () => r((server.address() as AddressInfo).port)));
}

const seen: string[] = [];
const origin = createServer((req, res) => {
  seen.push(req.url ?? '');
  req.resume();
  req.on('end', () => res.end('ok'));
});
const originPort = await listen(origin);

// node:http as a front door: the same handler shape as the proxy (answer 200 after the body).
const nodeSeen: string[] = [];
const front = createServer((req, res) => {
  nodeSeen.push(req.url ?? '');
  req.resume();
  req.on('end', () => res.end('ok'));
});
const frontPort = await listen(front);

const dir = mkdtempSync(join(tmpdir(), 'poolgate-corpus-nginx-'));
const probe = createServer();
const nginxPort = await listen(probe);
probe.close();
writeFileSync(
  join(dir, 'nginx.conf'),
  `daemon off; worker_processes 1; user root root; pid ${dir}/nginx.pid; error_log ${dir}/error.log warn;
events { worker_connections 256; }
http {
  access_log off; client_body_temp_path ${dir}/cb; proxy_temp_path ${dir}/p; fastcgi_temp_path ${dir}/f; uwsgi_temp_path ${dir}/u; scgi_temp_path ${dir}/s;
  upstream origin { server 127.0.0.1:${originPort}; keepalive 16; }
  server { listen 127.0.0.1:${nginxPort}; location / { if ($http_x_service_key != "k") { return 401; } proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; } }
}
`,
);
const nginx = spawn('nginx', ['-p', dir, '-c', join(dir, 'nginx.conf')], { stdio: 'inherit' });
await new Promise((r) => setTimeout(r, 800));

const fmt = (r: RawResult) => `${r.statuses.length ? r.statuses.join(', ') : 'none'}${r.closed ? ', closed' : ', open'}`;
const rows: string[] = [];
for (let i = 0; i < CORPUS.length; i++) {
  const c = CORPUS[i]!;
  const path = `/c${i}`;
  const before = seen.length;
  const ng = await sendRaw(nginxPort, c.bytes('corpus.pools.localhost', path, 'k'), 1500);
  await new Promise((r) => setTimeout(r, 100));
  const ngOrigin = seen.slice(before);
  const nodeBefore = nodeSeen.length;
  const nd = await sendRaw(frontPort, c.bytes('corpus.pools.localhost', path, 'k'), 1500);
  const ndSeen = nodeSeen.slice(nodeBefore);
  const want = `${c.statuses.length ? c.statuses.join(', ') : 'none'}${c.closes ? ', closed' : ', open'}`;
  rows.push(`| ${c.name} | ${want} | ${fmt(ng)} (origin: ${ngOrigin.length ? ngOrigin.join(' ') : '—'}) | ${fmt(nd)} (handler: ${ndSeen.length ? ndSeen.join(' ') : '—'}) |`);
}
console.log('| case | expected | nginx 1.22 | node:http (llhttp, Node ' + process.versions.node + ') |');
console.log('|---|---|---|---|');
for (const r of rows) console.log(r);
nginx.kill('SIGTERM');
origin.close();
front.close();
process.exit(0);
