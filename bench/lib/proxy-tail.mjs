// bench:proxy --mode=tail (issue 29): the latency tail at a fixed rate. Open loop (bench/lib/paced.mjs): requests
// started on schedule whatever the answers do, each latency counted from its scheduled start (wrk2's correction
// for coordinated omission), over keep-alive connections opened before the clock starts. The origin is
// `poolgate demo-origin` (node:https, the README's walk-through origin); the direct row is that origin alone, then
// nginx, the Node floor (node:http + undici, nothing else) and poolgate one after the other in the same run.
// Env: BENCH_RATE requests/s (default 2000), BENCH_CONNECTIONS (default 32; the first value of a list),
// BENCH_DURATION s per row (default 25), BENCH_WARMUP s of paced warm-up per target (default 3).
import { mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { startNginx } from './nginx.mjs';
import { ensureTool } from './wrk.mjs';
import { paced } from './paced.mjs';
import { cpuMeter } from './cpu.mjs';
import { machine, provenance, writeJson, writeMarkedSection, WRITE_RESULTS } from './results.mjs';
import { probe, startDemoOrigin, startNodeFloor, startPoolgateTarget } from './proxy-targets.mjs';
import { conditionNotes, fmt, intEnv, ratio } from './proxy-bench-common.mjs';

const diff = (a, b) => (typeof a === 'number' && typeof b === 'number' ? Math.round((a - b) * 1000) / 1000 : null);

export async function tail({ log, command }) {
  const m = machine();
  const haveNginx = ensureTool('nginx', 'nginx', log);
  const settings = {
    rate: intEnv('BENCH_RATE', 2000, 1),
    connections: Number((process.env.BENCH_CONNECTIONS || '32').split(',')[0]),
    duration_s: intEnv('BENCH_DURATION', 25, 1),
    warmup_s: intEnv('BENCH_WARMUP', 3, 0),
    pool_max_concurrent: 10_000,
    latency_from: 'scheduled start',
  };
  const notes = conditionNotes(m);
  if (!haveNginx) notes.push('nginx is not installed (apt-get install -y nginx) and could not be: no nginx row.');
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-tail-'));
  const stops = [];
  const rows = [];
  try {
    const origin = await startDemoOrigin(join(dir, 'demo-origin'));
    stops.push(() => origin.stop());
    log(`origin: poolgate demo-origin at ${origin.url} (pid ${origin.pid})`);
    const targets = [{ key: 'direct', name: 'direct (poolgate demo-origin, https)', url: `${origin.url}/`, headers: {}, pid: origin.pid, cpuOf: 'origin' }];
    if (haveNginx) {
      const port = Number(new URL(origin.url).port);
      const nginx = await startNginx({ originHost: '127.0.0.1', originPort: port, caFile: origin.caFile, tlsName: 'localhost', limitConn: settings.pool_max_concurrent });
      stops.push(() => nginx.stop());
      targets.push({ key: 'nginx', name: 'nginx', url: `http://127.0.0.1:${nginx.port}/`, headers: {}, pid: nginx.pid });
    }
    const floor = await startNodeFloor(origin.url, origin.caFile);
    stops.push(() => floor.stop());
    targets.push({ key: 'node_floor', name: 'Node floor (node:http + undici)', url: `http://127.0.0.1:${floor.port}/`, headers: {}, pid: floor.pid });
    const pg = await startPoolgateTarget(origin.url, origin.caFile, dir, { maxConcurrent: settings.pool_max_concurrent });
    stops.push(() => pg.stop());
    targets.push({ key: 'poolgate', name: 'poolgate', url: pg.url, headers: pg.headers, pid: pg.pid });
    // The origin itself is not probed: its certificate is self-signed (the paced client does not verify it).
    for (const t of targets) if (t.key !== 'direct') await probe(t);

    for (const t of targets) {
      const spec = { name: t.name, url: t.url, headers: t.headers, rate: settings.rate, connections: settings.connections };
      if (settings.warmup_s > 0) await paced({ ...spec, duration: settings.warmup_s });
      const cpu = cpuMeter(t.pid);
      const r = await paced({ ...spec, duration: settings.duration_s });
      const row = { target: t.key, name: t.name, requests: r.requests, rps: r.rps, latency_ms: r.latency_ms, errors: r.errors, non2xx: r.non2xx, cpu_us: cpu.per(r.requests), cpu_of: t.cpuOf ?? 'proxy' };
      rows.push(row);
      log(`${t.name} paced ${settings.rate}/s: p50 ${r.latency_ms.p50} ms, p99 ${r.latency_ms.p99} ms, p99.9 ${r.latency_ms.p999} ms, max ${r.latency_ms.max} ms, errors ${r.errors}, non-2xx ${r.non2xx}`);
    }
  } finally {
    for (const s of stops.reverse()) await s().catch((err) => log(`stop failed: ${err.message}`));
    rmSync(dir, { recursive: true, force: true });
  }
  const of = (k) => rows.find((r) => r.target === k);
  const ratios = {
    poolgate_over_floor_p99: ratio(of('poolgate')?.latency_ms.p99, of('node_floor')?.latency_ms.p99),
    nginx_over_floor_p99: ratio(of('nginx')?.latency_ms.p99, of('node_floor')?.latency_ms.p99),
    poolgate_minus_floor_p99_ms: diff(of('poolgate')?.latency_ms.p99, of('node_floor')?.latency_ms.p99),
    poolgate_minus_direct_p99_ms: diff(of('poolgate')?.latency_ms.p99, of('direct')?.latency_ms.p99),
    floor_minus_direct_p99_ms: diff(of('node_floor')?.latency_ms.p99, of('direct')?.latency_ms.p99),
    nginx_minus_direct_p99_ms: diff(of('nginx')?.latency_ms.p99, of('direct')?.latency_ms.p99),
  };
  for (const r of rows) {
    if (r.errors || r.non2xx) notes.push(`${r.name}: ${r.errors} errors, ${r.non2xx} non-2xx.`);
    if (r.rps < settings.rate * 0.95) notes.push(`${r.name} answered ${r.rps}/s of the ${settings.rate}/s offered: it could not keep up, so its tail is a backlog.`);
  }
  m.loadavg_1m_end = Math.round(loadavg()[0] * 100) / 100;
  const date = new Date().toISOString();
  const report = { benchmark: 'proxy', mode: 'tail', date, command, machine: m, settings, notes, rows, ratios };
  const path = writeJson(`proxy-tail-${date.replace(/[:.]/g, '-')}.json`, report);
  writeJson('proxy-tail-latest.json', report);
  log(`p99 poolgate / floor ${fmt(ratios.poolgate_over_floor_p99)}, nginx / floor ${fmt(ratios.nginx_over_floor_p99)}`);
  if (WRITE_RESULTS) {
    writeMarkedSection('proxy-tail', tailSection(report), 'Proxy: paced tail against the Node floor (issue 29)');
    log(`wrote ${path} and the bench:proxy-tail section of bench/RESULTS.md`);
  } else {
    log(`wrote ${path} (RESULTS.md untouched: pass --write-results)`);
  }
  return report;
}

export function tailSection(report) {
  const { settings: s, rows, ratios: q, notes } = report;
  return [
    '`npm run bench:proxy -- --mode=tail` (bench/lib/proxy-tail.mjs): open-loop load at a fixed rate, each latency counted from',
    "the request's scheduled start (coordinated omission corrected, as wrk2 does; bench/lib/paced.mjs), through `poolgate",
    'demo-origin` (node:https echo, self-signed certificate), to the origin alone, nginx, the Node floor (node:http + undici,',
    'nothing else) and poolgate (one data plane thread, adaptive off, access log to a file), one after the other in one run.',
    `${s.rate} requests/s over ${s.connections} keep-alive connections (opened before the clock starts) for ${s.duration_s} s per target after a ${s.warmup_s} s paced warm-up. Not pinned.`,
    '',
    provenance(report.machine, report.date, report.command),
    '',
    '| target | answered/s | p50 ms | p99 ms | p99.9 ms | max ms | CPU µs/request | errors | non-2xx |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...rows.map((r) => `| ${r.name} | ${r.rps} | ${fmt(r.latency_ms.p50)} | ${fmt(r.latency_ms.p99)} | ${fmt(r.latency_ms.p999)} | ${fmt(r.latency_ms.max)} | ${fmt(r.cpu_us?.total)}${r.cpu_of === 'origin' ? ' (origin)' : ''} | ${r.errors} | ${r.non2xx} |`),
    '',
    `p99 against the Node floor: poolgate ${fmt(q.poolgate_over_floor_p99)}× (${fmt(q.poolgate_minus_floor_p99_ms)} ms more), nginx ${fmt(q.nginx_over_floor_p99)}×. Added p99 over the origin alone: poolgate ${fmt(q.poolgate_minus_direct_p99_ms)} ms, Node floor ${fmt(q.floor_minus_direct_p99_ms)} ms, nginx ${fmt(q.nginx_minus_direct_p99_ms)} ms.`,
    ...(notes.length ? ['', 'Notes:', '', ...notes.map((n) => `- ${n}`)] : []),
  ].join('\n');
}
