// The runtime's own cost: the same proxy traffic through poolgate on Node 20 (an earlier checkout, before the move)
// and on Node 24 (this checkout), alternated in one run, everything else equal.
// Usage: BENCH_BEFORE=<checkout built on Node 20> [BENCH_BEFORE_NODE=/usr/bin/node] npm run bench:runtime
//   BENCH_ROUNDS (default 3), BENCH_DURATION seconds (default 8), BENCH_CONNECTIONS (default 50).
// The origin (bench/lib/tls-origin.mjs, uWebSockets.js over TLS) runs on BENCH_BEFORE_NODE, where uWS's native build
// loads; autocannon runs in this process. Figures: requests/s and poolgate's CPU per request (its /proc times, the
// steadier figure on a shared machine), each the median over the rounds. With --write-results, rewrites the bench:runtime
// section of bench/RESULTS.md.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { apiCaller, root, startPoolgate } from './lib/poolgate.mjs';
import { startChild } from './lib/child.mjs';
import { measure } from './lib/load.mjs';
import { cpuMeter } from './lib/cpu.mjs';
import { benchCommand, machine, writeJson, writeResults } from './lib/results.mjs';

const before = process.env.BENCH_BEFORE;
if (!before) throw new Error('BENCH_BEFORE=<checkout of the Node 20 build, with npm ci done> is required');
const beforeNode = process.env.BENCH_BEFORE_NODE || '/usr/bin/node';
const rounds = Number(process.env.BENCH_ROUNDS || 3);
const duration = Number(process.env.BENCH_DURATION || 8);
const connections = Number(process.env.BENCH_CONNECTIONS || 50);
const version = (node) => execFileSync(node, ['-p', 'process.version']).toString().trim();
const commit = (dir) => {
  try {
    return execFileSync('git', ['-C', dir, 'rev-parse', '--short', 'HEAD']).toString().trim();
  } catch {
    return dir;
  }
};
const log = (m) => process.stderr.write(`bench:runtime: ${m}\n`);

const dir = mkdtempSync(join(tmpdir(), 'bench-runtime-'));
const keyFile = join(dir, 'key.pem');
const certFile = join(dir, 'cert.pem');
execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', keyFile, '-out', certFile,
  '-days', '1', '-subj', '/CN=127.0.0.2', '-addext', 'subjectAltName=IP:127.0.0.2'], { stdio: 'ignore' });
const origin = await startChild(join(root, 'bench', 'lib', 'tls-origin.mjs'), ['127.0.0.2', keyFile, certFile], { node: beforeNode });

const targets = [
  { name: `Node ${version(beforeNode)} (${commit(before)})`, node: beforeNode, bin: join(before, 'bin', 'poolgate.js') },
  { name: `Node ${version(process.execPath)} (${commit(root)})`, node: process.execPath, bin: undefined },
];

async function once(target) {
  const svc = await startPoolgate(
    { POOLGATE_ORIGIN_CA_FILE: certFile, POOLGATE_ALLOW_PRIVATE_TARGETS: 'true', POOLGATE_LOG_LEVEL: 'warn', POOLGATE_ACCESS_LOG_FILE: join(dir, 'access.log') },
    { node: target.node, bin: target.bin },
  );
  try {
    const boot = await svc.admin(['bootstrap', '--team', 'Bench', '--email', 'bench@bench.test', '--plan', 'business']);
    const call = apiCaller(svc.controlUrl, boot.token);
    const pool = await call('POST', '/api/v1/pools', { origin: `https://127.0.0.2:${origin.port}`, name: 'bench-runtime' }, 201);
    const { key } = await call('POST', `/api/v1/pools/${pool.subdomain}/keys`, { label: 'bench' }, 201);
    await call('PATCH', `/api/v1/pools/${pool.subdomain}/settings`, { max_concurrent: 10_000, settings: { adaptive: false } }, 200);
    const spec = { url: `http://127.0.0.1:${svc.listening.proxy}/`, headers: { host: `${pool.subdomain}.pools.localhost`, 'x-service-key': key }, connections };
    // Until the raised limit is live (a 10-slot pool would queue at 50 connections), then a warm-up.
    for (let i = 0; i < 100; i++) {
      const r = await fetch(spec.url, { headers: { 'x-service-pool': pool.subdomain, 'x-service-key': key } });
      await r.arrayBuffer();
      if (r.status === 200 && r.headers.get('x-service-effective-limit') === '10000') break;
      await new Promise((res) => setTimeout(res, 100));
    }
    await measure({ ...spec, name: 'warm-up', duration: 2 });
    const cpu = cpuMeter(svc.pid);
    const r = await measure({ ...spec, name: target.name, duration });
    const per = cpu.per(r.requests);
    return { rps: r.rps, p99_ms: r.latency_ms.p99, cpu_us: per ? Math.round(per.total) : null, non2xx: r.non2xx, errors: r.errors };
  } finally {
    await svc.stop();
  }
}

const results = targets.map(() => []);
for (let round = 0; round < rounds; round++) {
  // Alternate the order each round, so neither target always runs on a warmer (or busier) machine.
  const order = round % 2 === 0 ? [0, 1] : [1, 0];
  for (const i of order) {
    const r = await once(targets[i]);
    log(`round ${round + 1}: ${targets[i].name}: ${r.rps} req/s, ${r.cpu_us} µs CPU/request, p99 ${r.p99_ms} ms`);
    results[i].push(r);
  }
}
await origin.stop();
rmSync(dir, { recursive: true, force: true });

const median = (xs) => {
  const s = xs.filter((x) => x !== null).sort((a, b) => a - b);
  return s.length ? (s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2) : null;
};
const rows = targets.map((t, i) => ({ name: t.name, rps: median(results[i].map((r) => r.rps)), cpu_us: median(results[i].map((r) => r.cpu_us)), rounds: results[i] }));
const m = machine();
writeJson('runtime.json', { machine: m, settings: { rounds, duration, connections }, rows });
writeResults(
  'runtime',
  'Runtime: Node 20 → 24',
  [
    `Proxy traffic (autocannon, ${connections} connections, ${duration} s, ${rounds} alternated rounds, medians) through poolgate with every`,
    'role in one process, embedded store, adaptive off, access log to a file; the origin is uWS over TLS on Node 20.',
    '',
    '| poolgate on | requests/s | CPU µs/request | each round (req/s, µs) |',
    '|---|---:|---:|---|',
    ...rows.map((r) => `| ${r.name} | ${r.rps} | ${r.cpu_us} | ${r.rounds.map((x) => `${x.rps}, ${x.cpu_us}`).join('; ')} |`),
    '',
    `Node 24 / Node 20: requests/s ${(rows[1].rps / rows[0].rps).toFixed(2)}×, CPU per request ${(rows[1].cpu_us / rows[0].cpu_us).toFixed(2)}×.`,
  ].join('\n'),
  { command: benchCommand('npm run bench:runtime'), m },
);
