// The HTTP layer's own CPU cost, the figure behind docs/http-front-door.md: a uWebSockets.js 20.30
// server and a node:http server (llhttp) answering the same small GET, each driven by autocannon at the same
// paced rate and connection count, alternated in rounds; CPU = utime+stime of the server process per request.
// Usage: node bench/front-door-cpu.mjs [rate=2000] [seconds=8] [rounds=3]
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const [rate = 2000, seconds = 8, rounds = 3] = process.argv.slice(2).map(Number);
const SERVERS = {
  uws: `
    const { createRequire } = require('node:module');
    console.warn = () => {};
    const uws = require(${JSON.stringify(createRequire(import.meta.url).resolve('uWebSockets.js'))});
    const app = uws.App();
    app.any('/*', (res, req) => {
      const h = {}; req.forEach((k, v) => { h[k] = v; });
      res.onAborted(() => {});
      res.cork(() => res.writeStatus('200 OK').writeHeader('content-type', 'application/json').end('{"ok":true}'));
    });
    app.listen('127.0.0.1', 0, (s) => console.log(uws.us_socket_local_port(s)));`,
  'node:http': `
    const http = require('node:http');
    const server = http.createServer((req, res) => {
      const h = req.headers;
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': 11 });
      res.end('{"ok":true}');
    });
    server.keepAliveTimeout = 30000;
    server.listen(0, '127.0.0.1', () => console.log(server.address().port));`,
};

const ticks = (pid) => {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return Number(f[11]) + Number(f[12]);
};

async function round(name) {
  const child = spawn(process.execPath, ['-e', SERVERS[name]], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise((r) => child.stdout.once('data', (d) => r(Number(String(d).trim()))));
  const ac = createRequire(import.meta.url).resolve('autocannon/autocannon.js');
  // A short warm-up, then the measured run.
  await new Promise((r) => spawn(process.execPath, [ac, '-c', '64', '-R', String(rate), '-d', '2', `http://127.0.0.1:${port}/x`], { stdio: 'ignore' }).on('exit', r));
  const before = ticks(child.pid);
  const out = await new Promise((r) => {
    const p = spawn(process.execPath, [ac, '-j', '-c', '64', '-R', String(rate), '-d', String(seconds), `http://127.0.0.1:${port}/x`], { stdio: ['ignore', 'pipe', 'ignore'] });
    let s = '';
    p.stdout.on('data', (d) => (s += d));
    p.on('exit', () => r(JSON.parse(s)));
  });
  const used = (ticks(child.pid) - before) / 100;
  child.kill();
  const n = out.requests.total;
  return { name, requests: n, non2xx: out.non2xx, errors: out.errors, cpuUsPerReq: (used * 1e6) / n, p50: out.latency.p50, p99: out.latency.p99 };
}

const results = [];
for (let i = 0; i < rounds; i++) for (const name of Object.keys(SERVERS)) results.push(await round(name));
for (const r of results) console.log(JSON.stringify(r));
for (const name of Object.keys(SERVERS)) {
  const xs = results.filter((r) => r.name === name).map((r) => r.cpuUsPerReq).sort((a, b) => a - b);
  console.log(`${name}: median ${xs[Math.floor(xs.length / 2)].toFixed(1)} µs CPU per request (${xs.map((x) => x.toFixed(1)).join(', ')})`);
}
