// Proxy benchmark, three modes (--mode=…, or BENCH_MODE):
//  matrix (default): one https origin (uWS SSLApp, self-signed cert made now, a small fixed JSON body) behind
//    (a) nothing, (b) poolgate, (c) nginx with limit_conn, (d) fastify + @fastify/http-proxy, (e) the Node floor
//    (node:http + undici, nothing else), each driven side by side in one run by autocannon and (when installed) wrk.
//  saturation (issue 29): poolgate, the Node floor and nginx at saturation, proxy pinned to one core, load and origin
//    on the others; ≥ 3 alternated rounds, medians; rps and CPU per request as ratios to the Node floor
//    (bench/lib/proxy-saturation.mjs).
//  tail (issue 29): paced open-loop load (latency from each request's scheduled start) through `poolgate
//    demo-origin` to nginx, the Node floor and poolgate one after the other (bench/lib/proxy-tail.mjs).
// Every mode writes bench/out/proxy-*.json; with --write-results it also rewrites its own marked section of
// bench/RESULTS.md (bench:proxy, bench:proxy-saturation, bench:proxy-tail), nothing else there.
// Usage: npm run bench:proxy [-- --mode=saturation|tail] [-- --write-results]
// Matrix env: BENCH_DURATION seconds, default 8; BENCH_WARMUP, default 2;
// BENCH_CONNECTIONS, default "50,100"; BENCH_CPU_PROF=<dir> runs poolgate with --cpu-prof into dir; BENCH_NODE_ARGS
// adds node flags to poolgate's command line (e.g. --perf-basic-prof; --trace-gc with BENCH_CHILD_STDOUT=<file>, which
// appends poolgate's stdout there; BENCH_CHILD_STDERR likewise); BENCH_PACED_SERIES=<prefix> writes each paced request's
// start and latency (bench/lib/paced.mjs);
// BENCH_LABEL names the run in the JSON; BENCH_TARGETS=direct,poolgate,nginx,node_peer,node_floor picks targets;
// BENCH_ROUNDS=N measures every target N times, interleaved, and reports medians; BENCH_THREADS=N adds poolgate with N data plane threads,
// default 2, 0 for none. The other modes' knobs are in their files.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { root } from './lib/poolgate.mjs';
import { measure } from './lib/load.mjs';
import { machine, provenance, writeJson, writeMarkedSection, WRITE_RESULTS } from './lib/results.mjs';
import { probe, startNodeFloor, startPoolgateTarget, startTlsOrigin } from './lib/proxy-targets.mjs';
import { saturation } from './lib/proxy-saturation.mjs';
import { tail } from './lib/proxy-tail.mjs';
import { startChild } from './lib/child.mjs';
import { startNginx } from './lib/nginx.mjs';
import { ensureTool, wrkSpread } from './lib/wrk.mjs';
import { paced } from './lib/paced.mjs';
import { cpuMeter } from './lib/cpu.mjs';

function intEnv(name, def, min) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return def;
  if (!/^\d+$/.test(raw) || Number(raw) < min) throw new Error(`${name} must be an integer ≥ ${min}, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

const settings = {
  duration_s: intEnv('BENCH_DURATION', 8, 1),
  warmup_s: intEnv('BENCH_WARMUP', 2, 0),
  connections: (process.env.BENCH_CONNECTIONS || '50,100').split(',').map(Number),
  // The open-loop row: this many requests per second over the first connection count (0: no such row).
  paced_rate: intEnv('BENCH_RATE', 2000, 0),
  // A second poolgate with this many data plane threads on the one proxy port (SO_REUSEPORT: the kernel
  // spreads the connections). 0: no such row.
  dataplane_threads: intEnv('BENCH_THREADS', 2, 0),
  // Rounds over every target, interleaved; the tables show each figure's median over the rounds (a busy,
  // shared machine moves every row between rounds, so one round alone can mislead).
  rounds: intEnv('BENCH_ROUNDS', 1, 1),
  // The origin binds a loopback address other than 127.0.0.1, the service's own host (refused as a target).
  origin_host: '127.0.0.2',
  pool_max_concurrent: 10_000,
  store: 'embedded (PGlite, fresh data dir)',
  adaptive: false,
  access_logs: 'poolgate and nginx each log every request to a file',
};
const log = (msg) => process.stderr.write(`bench:proxy: ${msg}\n`);

const ratio = (a, b) => (a && b ? Math.round((a / b) * 100) / 100 : null);
/** ", proxy CPU x µs/request (user u, sys s)" for a row that has it. */
const cpuLog = (r) => (r.cpu_us ? `, proxy CPU ${r.cpu_us.total} µs/request (user ${r.cpu_us.user}, sys ${r.cpu_us.system})` : '');
const diff = (a, b) => (a !== null && b !== null && a !== undefined && b !== undefined ? Math.round((a - b) * 1000) / 1000 : null);

/** Ratios per tool and connection count: poolgate against nginx, the Node.js peer, the origin itself and the before build. */
function ratiosOf(rows, connectionCounts) {
  const ratios = [];
  for (const tool of ['wrk', 'autocannon', 'paced']) {
    for (const connections of connectionCounts) {
      const get = (k) => rows.find((r) => r.tool === tool && r.connections === connections && r.target === k);
      const pg_ = get('poolgate');
      if (!pg_) continue;
      // At a fixed rate every target does the same requests per second: only the latencies compare.
      const rpsRatio = (k) => (tool === 'paced' ? null : ratio(pg_.rps, get(k)?.rps));
      const th = get('poolgate_threads');
      const threadsRatio = (k) => (tool === 'paced' || !th ? null : ratio(th.rps, get(k)?.rps));
      ratios.push({
        tool,
        connections,
        threads_over_nginx_rps: threadsRatio('nginx'),
        threads_over_node_peer_rps: threadsRatio('node_peer'),
        threads_over_one_thread_rps: threadsRatio('poolgate'),
        threads_p99_minus_direct_ms: diff(th?.latency_ms.p99, get('direct')?.latency_ms.p99),
        poolgate_over_nginx_rps: rpsRatio('nginx'),
        poolgate_over_node_peer_rps: rpsRatio('node_peer'),
        poolgate_over_node_floor_rps: rpsRatio('node_floor'),
        poolgate_over_node_floor_cpu: tool === 'paced' ? null : ratio(pg_.cpu_us?.total, get('node_floor')?.cpu_us?.total),
        poolgate_p50_minus_direct_ms: diff(pg_.latency_ms.p50, get('direct')?.latency_ms.p50),
        poolgate_p99_minus_direct_ms: diff(pg_.latency_ms.p99, get('direct')?.latency_ms.p99),
        nginx_p50_minus_direct_ms: diff(get('nginx')?.latency_ms.p50, get('direct')?.latency_ms.p50),
        nginx_p99_minus_direct_ms: diff(get('nginx')?.latency_ms.p99, get('direct')?.latency_ms.p99),
        poolgate_over_before_rps: rpsRatio('poolgate_before'),
      });
    }
  }
  return ratios;
}

async function main() {
  const m = machine();
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-proxy-'));
  const haveWrk = ensureTool('wrk', 'wrk', log);
  const haveNginx = ensureTool('nginx', 'nginx', log);
  const notes = [];
  if (!haveWrk) notes.push('wrk is not installed and could not be: autocannon figures only.');
  if (!haveNginx) notes.push('nginx is not installed and could not be: no nginx row.');
  const stops = [];
  const rows = [];
  try {
    const { origin, certFile, originUrl } = await startTlsOrigin(dir, settings.origin_host);
    stops.push(() => origin.stop());
    log(`origin ${originUrl} (pid ${origin.pid})`);

    // The direct target is the origin itself over TLS (neither autocannon nor wrk verifies its certificate).
    const targets = [{ name: 'direct (origin, https)', key: 'direct', url: `${originUrl}/`, headers: {} }];

    const poolgate = await startPoolgateTarget(originUrl, certFile, dir, { maxConcurrent: settings.pool_max_concurrent });
    stops.push(() => poolgate.stop());
    targets.push({ name: 'poolgate', key: 'poolgate', url: poolgate.url, headers: poolgate.headers, pid: poolgate.pid });
    log(`poolgate pid ${poolgate.pid} on ${poolgate.url}`);
    if (settings.dataplane_threads > 1) {
      const threaded = await startPoolgateTarget(originUrl, certFile, dir, { threads: settings.dataplane_threads, maxConcurrent: settings.pool_max_concurrent });
      stops.push(() => threaded.stop());
      targets.push({ name: `poolgate, ${settings.dataplane_threads} threads (one port)`, key: 'poolgate_threads', url: threaded.url, urls: threaded.urls, headers: threaded.headers, pid: threaded.pid });
      log(`poolgate (${settings.dataplane_threads} threads) pid ${threaded.pid} on ${threaded.url}`);
    }
    // BENCH_BEFORE_ROOT=<dir with another build>: that build too, side by side (a fix's before and after).
    if (process.env.BENCH_BEFORE_ROOT) {
      const before = await startPoolgateTarget(originUrl, certFile, dir, { bin: join(process.env.BENCH_BEFORE_ROOT, 'bin', 'poolgate.js'), maxConcurrent: settings.pool_max_concurrent });
      stops.push(() => before.stop());
      targets.push({ name: `poolgate before (${process.env.BENCH_BEFORE_LABEL ?? process.env.BENCH_BEFORE_ROOT})`, key: 'poolgate_before', url: before.url, headers: before.headers, pid: before.pid });
    }

    if (haveNginx) {
      const nginx = await startNginx({ originHost: settings.origin_host, originPort: origin.port, caFile: certFile, tlsName: 'localhost', limitConn: settings.pool_max_concurrent });
      stops.push(() => nginx.stop());
      targets.push({ name: 'nginx (limit_conn, keepalive upstream)', key: 'nginx', url: `http://127.0.0.1:${nginx.port}/`, headers: {}, pid: nginx.pid });
    }

    const peer = await startChild(join(root, 'bench/lib/node-peer.mjs'), [originUrl, certFile]);
    stops.push(() => peer.stop());
    targets.push({ name: 'fastify + @fastify/http-proxy', key: 'node_peer', url: `http://127.0.0.1:${peer.port}/`, headers: {}, pid: peer.pid });

    const floor = await startNodeFloor(originUrl, certFile);
    stops.push(() => floor.stop());
    targets.push({ name: 'Node floor (node:http + undici)', key: 'node_floor', url: `http://127.0.0.1:${floor.port}/`, headers: {}, pid: floor.pid });

    for (const t of targets) {
      if (t.key !== 'direct') await probe(t);
    }
    // BENCH_TARGETS=poolgate,nginx measures only those (for before/after runs of one change).
    const only = process.env.BENCH_TARGETS ? new Set(process.env.BENCH_TARGETS.split(',')) : null;
    if (only) targets.splice(0, targets.length, ...targets.filter((t) => only.has(t.key)));

    for (let round = 1; round <= settings.rounds; round++) {
    for (const connections of settings.connections) {
      for (const t of targets) {
        const spec = { name: t.name, url: t.url, urls: t.urls, headers: t.headers, connections };
        if (settings.warmup_s > 0) await measure({ ...spec, duration: settings.warmup_s });
        // The proxy's CPU time per request (the direct target has no proxy): steadier than rps on a shared machine.
        let cpu = cpuMeter(t.pid);
        const a = await measure({ ...spec, duration: settings.duration_s });
        rows.push({ target: t.key, tool: 'autocannon', connections, round, ...a, cpu_us: cpu.per(a.requests) });
        log(`${t.name} c=${connections} autocannon: ${a.rps} req/s, p50 ${a.latency_ms.p50} ms, p99 ${a.latency_ms.p99} ms, errors ${a.errors}, non-2xx ${a.non2xx}${cpuLog(rows.at(-1))}`);
        if (haveWrk) {
          cpu = cpuMeter(t.pid);
          const w = await wrkSpread({ ...spec, duration: settings.duration_s });
          rows.push({ target: t.key, connections, round, ...w, cpu_us: cpu.per(w.requests) });
          log(`${t.name} c=${connections} wrk: ${w.rps} req/s, p50 ${w.latency_ms.p50} ms, p99 ${w.latency_ms.p99} ms, errors ${w.errors}, non-2xx ${w.non2xx}${cpuLog(rows.at(-1))}`);
        }
        if (settings.paced_rate > 0 && connections === settings.connections[0]) {
          cpu = cpuMeter(t.pid);
          const p = await paced({ ...spec, rate: settings.paced_rate, duration: settings.duration_s });
          rows.push({ target: t.key, round, ...p, tool: 'paced', cpu_us: cpu.per(p.requests) });
          log(`${t.name} c=${connections} paced ${settings.paced_rate}/s: p50 ${p.latency_ms.p50} ms, p99 ${p.latency_ms.p99} ms, errors ${p.errors}, non-2xx ${p.non2xx}${cpuLog(rows.at(-1))}`);
        }
      }
    }
    }
  } finally {
    for (const s of stops.reverse()) await s().catch((err) => log(`stop failed: ${err.message}`));
    rmSync(dir, { recursive: true, force: true });
  }

  const medians = settings.rounds > 1 ? medianRows(rows) : rows;
  const ratios = ratiosOf(medians, settings.connections);
  for (const r of rows) {
    if (r.errors > 0 || r.non2xx > 0) notes.push(`${r.name} (${r.tool}, ${r.connections} connections): ${r.errors} errors, ${r.non2xx} non-2xx.`);
  }
  if (m.loadavg_1m > m.nproc) notes.push(`The machine was busy with other work (load average ${m.loadavg_1m} on ${m.nproc} CPUs at the start).`);

  const when = new Date();
  m.loadavg_1m_end = Math.round(loadavg()[0] * 100) / 100;
  const report = { benchmark: 'proxy', label: process.env.BENCH_LABEL ?? null, date: when.toISOString(), machine: m, settings, notes, rows, median_rows: medians, ratios };
  const stamp = when.toISOString().replace(/[:.]/g, '-');
  const jsonPath = writeJson(`proxy-${stamp}.json`, report);
  writeJson('proxy-latest.json', report);
  report.command = commandLine();
  if (!WRITE_RESULTS || process.env.BENCH_NO_SECTION) {
    log(`wrote ${jsonPath} (RESULTS.md untouched: pass --write-results to rewrite its bench:proxy section)`);
    return;
  }
  writeMarkedSection('proxy', proxySection(report), 'Proxy');
  log(`wrote ${jsonPath} and the bench:proxy section of bench/RESULTS.md`);
}

/** One row per target, tool and connection count: the median of each figure over the rounds, errors added up. */
function medianRows(rows) {
  const groups = new Map();
  for (const r of rows) {
    const k = `${r.target}|${r.tool}|${r.connections}`;
    if (!groups.has(k)) groups.set(k, []);
    groups.get(k).push(r);
  }
  const median = (xs) => {
    const v = xs.filter((x) => x !== null && x !== undefined).sort((a, b) => a - b);
    if (v.length === 0) return null;
    const mid = Math.floor(v.length / 2);
    return v.length % 2 ? v[mid] : Math.round(((v[mid - 1] + v[mid]) / 2) * 1000) / 1000;
  };
  return [...groups.values()].map((g) => ({
    ...g[0],
    round: undefined,
    rounds: g.length,
    rps: median(g.map((r) => r.rps)),
    rps_each_round: g.map((r) => r.rps),
    latency_ms: { p50: median(g.map((r) => r.latency_ms.p50)), p99: median(g.map((r) => r.latency_ms.p99)) },
    cpu_us: g.some((r) => r.cpu_us)
      ? { total: median(g.map((r) => r.cpu_us?.total)), user: median(g.map((r) => r.cpu_us?.user)), system: median(g.map((r) => r.cpu_us?.system)) }
      : null,
    errors: g.reduce((a, r) => a + r.errors, 0),
    non2xx: g.reduce((a, r) => a + r.non2xx, 0),
  }));
}

/** The section text (between the bench:proxy markers; the hand-written subsections below them stay). */
export function proxySection(report) {
  const { machine: m, settings: s, notes } = report;
  const rows = report.median_rows ?? report.rows;
  const ratios = ratiosOf(rows, s.connections);
  const f = (n) => (n === null || n === undefined ? '–' : String(n));
  const table = [
    '| target | tool | connections | rps | p50 ms | p99 ms | proxy CPU µs/request (user / sys) | errors | non-2xx | rps each round |',
    '|---|---|---:|---:|---:|---:|---:|---:|---:|---|',
    ...rows.map(
      (r) =>
        `| ${r.name} | ${r.tool} | ${r.connections} | ${r.rps} | ${f(r.latency_ms.p50)} | ${f(r.latency_ms.p99)} | ${r.cpu_us ? `${r.cpu_us.total} (${r.cpu_us.user} / ${r.cpu_us.system})` : '–'} | ` +
        `${r.errors} | ${r.non2xx} | ${r.rps_each_round ? r.rps_each_round.join(' / ') : ''} |`,
    ),
  ];
  const ratioTable = [
    '| tool | connections | poolgate / nginx rps (target ≥ 0.5) | poolgate / Node.js peer rps (target ≥ 1.5) | poolgate / Node floor rps (target ≥ 0.9) | poolgate / Node floor CPU per request (unpinned here; `--mode=saturation` pins) | poolgate − direct p50 ms | poolgate − direct p99 ms (target < 1 at 50) | nginx − direct p50 ms | nginx − direct p99 ms | poolgate / before rps | N threads / nginx rps | N threads / Node.js peer rps | N threads / 1 thread rps | N threads − direct p99 ms |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...ratios.map(
      (r) =>
        `| ${r.tool} | ${r.connections} | ${f(r.poolgate_over_nginx_rps)} | ${f(r.poolgate_over_node_peer_rps)} | ${f(r.poolgate_over_node_floor_rps)} | ${f(r.poolgate_over_node_floor_cpu)} | ${f(r.poolgate_p50_minus_direct_ms)} | ` +
        `${f(r.poolgate_p99_minus_direct_ms)} | ${f(r.nginx_p50_minus_direct_ms)} | ${f(r.nginx_p99_minus_direct_ms)} | ${f(r.poolgate_over_before_rps)} | ` +
        `${f(r.threads_over_nginx_rps)} | ${f(r.threads_over_node_peer_rps)} | ${f(r.threads_over_one_thread_rps)} | ${f(r.threads_p99_minus_direct_ms)} |`,
    ),
  ];
  return [
    '`npm run bench:proxy` (bench/proxy.mjs): one https origin (bench/lib/tls-origin.mjs on 127.0.0.2: uWS SSLApp where its native build',
    'loads, else node:https; self-signed certificate made at run time, a 46-byte JSON body) measured directly and behind four proxies, each in its own process,',
    'one after the other in the same run with the same load generators. Clients speak plain http/1.1 keep-alive',
    'to the proxies; the proxies speak https with keep-alive to the origin.',
    '',
    '- poolgate: `node bin/poolgate.js start` (every role, embedded store); pool, key and settings through the Control API',
    `  (\`PATCH …/settings\`: max_concurrent ${s.pool_max_concurrent}, adaptive off, so nothing queues); key sent as X-Service-Key; access log to a file`,
    '- nginx: `worker_processes auto`, `limit_conn` on the server, `keepalive 128` upstream, `proxy_ssl_verify on`, access log to a file',
    '- Node.js peer: fastify 5 + @fastify/http-proxy (undici, 128 keep-alive connections), logger off',
    '- Node floor: node:http + one undici Pool (128 keep-alive connections), status, content-type and body passed back, nothing else (bench/lib/node-floor.mjs)',
    ...(rows.some((r) => r.target === 'poolgate_threads')
      ? [
          '- poolgate, N threads: the same, with `POOLGATE_DATAPLANE_THREADS=N` (every thread on the one proxy port; the kernel spreads the connections)',
        ]
      : []),
    ...(rows.some((r) => r.target === 'poolgate_before')
      ? ['- poolgate before: the same commit with the hot-path fixes of this round undone (BENCH_BEFORE_ROOT), set up the same way']
      : []),
    '',
    provenance(m, report.date, report.command ?? 'npm run bench:proxy -- --write-results'),
    '- load generator, origin and proxy all on this machine',
    `- settings: ${s.duration_s} s per row after a ${s.warmup_s} s autocannon warm-up; wrk \`-t2 --latency\`; no pipelining` +
      (s.rounds > 1 ? `; ${s.rounds} rounds over every target, interleaved: each figure is the median of the rounds (rps of each round in the JSON), errors added up` : ''),
    '- proxy CPU: user and system CPU time of the proxy process (all its threads; nginx: master and workers) during the row, per request answered; steadier than rps on a shared machine',
    ...(s.paced_rate
      ? [`- paced rows: open loop, ${s.paced_rate} requests/s started on a 1 ms tick over ${s.connections[0]} undici keep-alive connections (all opened before the clock starts), latency from each request's scheduled start, in µs resolution — the added-latency figure (closed-loop p99 at ${s.connections[0]} connections is mostly the queue in front of a saturated server)`]
      : []),
    '',
    ...table,
    '',
    ...ratioTable,
    ...(notes.length ? ['', 'Notes:', '', ...notes.map((n) => `- ${n}`)] : []),
  ].join('\n');
}

/** How this run was asked for, to put in its section: the BENCH_* settings and the flags. */
function commandLine() {
  const env = Object.entries(process.env)
    .filter(([k]) => k.startsWith('BENCH_') && k !== 'BENCH_SECTION_FROM')
    .map(([k, v]) => `${k}=${v}`);
  const args = process.argv.slice(2);
  return [...env, 'npm run bench:proxy', ...(args.length ? ['--', ...args] : [])].join(' ');
}

// --mode=matrix (default: every target × tool × connection count), saturation or tail (issue 29).
const modeArg = process.argv.find((a) => a.startsWith('--mode='))?.slice('--mode='.length) ?? process.env.BENCH_MODE ?? 'matrix';
const MODES = {
  matrix: main,
  saturation: () => saturation({ log, command: commandLine() }),
  tail: () => tail({ log, command: commandLine() }),
};
if (!MODES[modeArg]) {
  process.stderr.write(`bench:proxy: unknown --mode=${modeArg}: one of ${Object.keys(MODES).join(', ')}\n`);
  process.exit(2);
}
// BENCH_SECTION_FROM=<report.json> rewrites the matrix section from a saved run without measuring again.
const run = process.env.BENCH_SECTION_FROM
  ? async () => {
      const report = JSON.parse(readFileSync(process.env.BENCH_SECTION_FROM, 'utf8'));
      writeMarkedSection('proxy', proxySection(report), 'Proxy');
      log(`wrote the bench:proxy section of bench/RESULTS.md from ${process.env.BENCH_SECTION_FROM}`);
    }
  : MODES[modeArg];

run().catch((err) => {
  process.stderr.write(`bench:proxy failed: ${err.stack ?? err}\n`);
  process.exit(1);
});
