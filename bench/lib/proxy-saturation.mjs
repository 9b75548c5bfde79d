// bench:proxy --mode=saturation (issue 29): throughput and CPU per request at saturation, poolgate against the
// Node floor (node:http + undici, nothing else) and nginx, in one run on one machine, so the figures that carry
// to another machine are the ratios. Each proxy process is pinned to the proxy core(s) with taskset and the
// load generator, origin and this driver to the others, so "CPU per request" is the proxy's own and the
// proxies do not steal from the load generator. Rounds alternate the order of the targets; each figure is the
// median over the rounds.
// Env: BENCH_DURATION s per row (default 10), BENCH_WARMUP s (default 2), BENCH_ROUNDS (default 3),
// BENCH_CONNECTIONS (default 50; the first value of a list), BENCH_TOOL=wrk|autocannon (default wrk when
// installed), BENCH_WRK_THREADS (default 2), BENCH_PIN=0 | BENCH_PIN_PROXY=<cpus> BENCH_PIN_LOAD=<cpus>.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { root } from './poolgate.mjs';
import { startChild } from './child.mjs';
import { startNginx, startNginxOrigin } from './nginx.mjs';
import { ensureTool, wrk } from './wrk.mjs';
import { measure } from './load.mjs';
import { cpuMeter } from './cpu.mjs';
import { machine, provenance, writeJson, writeMarkedSection, WRITE_RESULTS } from './results.mjs';
import { probe, selfSignedCert, startNodeFloor, startPoolgateTarget } from './proxy-targets.mjs';
import { conditionNotes, fmt, intEnv, median, pinPlan, ratio } from './proxy-bench-common.mjs';

/** Issue 29's targets, as ratios to the Node floor measured in the same run. */
export const SATURATION_TARGET = { rps_over_floor: 0.9, cpu_over_floor: 1.15 };

export async function saturation({ log, command }) {
  const m = machine();
  const haveWrk = process.env.BENCH_TOOL !== 'autocannon' && ensureTool('wrk', 'wrk', log);
  const haveNginx = ensureTool('nginx', 'nginx', log);
  const settings = {
    duration_s: intEnv('BENCH_DURATION', 10, 1),
    warmup_s: intEnv('BENCH_WARMUP', 2, 0),
    rounds: intEnv('BENCH_ROUNDS', 3, 1),
    connections: Number((process.env.BENCH_CONNECTIONS || '50').split(',')[0]),
    tool: haveWrk ? 'wrk' : 'autocannon',
    wrk_threads: intEnv('BENCH_WRK_THREADS', 2, 1),
    origin_host: '127.0.0.2',
    pool_max_concurrent: 10_000,
    pin: pinPlan(),
  };
  const notes = conditionNotes(m);
  if (!haveWrk && process.env.BENCH_TOOL !== 'autocannon') notes.push('wrk is not installed (apt-get install -y wrk) and could not be: autocannon drove every row.');
  if (!haveNginx) notes.push('nginx is not installed (apt-get install -y nginx) and could not be: no nginx row.');
  if (settings.rounds < 3) notes.push(`${settings.rounds} round(s): issue 29 asks for the median of ≥ 3.`);
  if (!settings.pin) notes.push('Not pinned (BENCH_PIN=0 or one CPU): CPU per request includes contention with the load generator.');
  if (settings.pin) {
    // This driver (autocannon runs in it; wrk and the origin are its children) on the load CPUs.
    execFileSync('taskset', ['-a', '-c', '-p', settings.pin.load, String(process.pid)], { stdio: 'ignore' });
    log(`pinned: proxies on CPU ${settings.pin.proxy}, load generator, origin and driver on ${settings.pin.load}`);
  }
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-saturation-'));
  const stops = [];
  const rows = [];
  try {
    const { keyFile, certFile } = selfSignedCert(dir, settings.origin_host);
    // nginx's C origin where nginx is installed (it must not be the bottleneck: it shares the load CPUs),
    // else the Node one (bench/lib/tls-origin.mjs).
    const origin = haveNginx
      ? await startNginxOrigin({ host: settings.origin_host, keyFile, certFile, pin: settings.pin?.load })
      : await startChild(join(root, 'bench/lib/tls-origin.mjs'), [settings.origin_host, keyFile, certFile], { pin: settings.pin?.load });
    settings.origin = haveNginx ? 'nginx, 1 worker, a fixed body from its config' : 'node:https, bench/lib/tls-origin.mjs';
    stops.push(() => origin.stop());
    const originUrl = `https://${settings.origin_host}:${origin.port}`;
    const pin = settings.pin?.proxy;

    const targets = [];
    const floor = await startNodeFloor(originUrl, certFile, pin);
    stops.push(() => floor.stop());
    targets.push({ key: 'node_floor', name: 'Node floor (node:http + undici)', url: `http://127.0.0.1:${floor.port}/`, headers: {}, pid: floor.pid });
    // The floor plus the spec's per-request duties (bench/lib/node-floor.mjs --obligations): how much of poolgate's
    // cost over the floor those take by themselves.
    const duties = await startNodeFloor(originUrl, certFile, pin, undefined, join(dir, 'floor-access.log'));
    stops.push(() => duties.stop());
    targets.push({ key: 'node_floor_obligations', name: 'Node floor + the spec\'s per-request duties', url: `http://127.0.0.1:${duties.port}/`, headers: {}, pid: duties.pid });
    const pg = await startPoolgateTarget(originUrl, certFile, dir, { pin, maxConcurrent: settings.pool_max_concurrent });
    stops.push(() => pg.stop());
    targets.push({ key: 'poolgate', name: 'poolgate', url: pg.url, headers: pg.headers, pid: pg.pid });
    // BENCH_BEFORE_ROOT=<dir with another built checkout>: that build too, in the same rounds (a change's before and after).
    if (process.env.BENCH_BEFORE_ROOT) {
      const before = await startPoolgateTarget(originUrl, certFile, dir, { bin: join(process.env.BENCH_BEFORE_ROOT, 'bin', 'poolgate.js'), pin, maxConcurrent: settings.pool_max_concurrent });
      stops.push(() => before.stop());
      targets.push({ key: 'poolgate_before', name: `poolgate before (${process.env.BENCH_BEFORE_LABEL ?? process.env.BENCH_BEFORE_ROOT})`, url: before.url, headers: before.headers, pid: before.pid });
    }
    if (haveNginx) {
      const nginx = await startNginx({
        originHost: settings.origin_host, originPort: origin.port, caFile: certFile, tlsName: 'localhost',
        limitConn: settings.pool_max_concurrent, workers: settings.pin?.proxy_cpus ?? 'auto', pin,
      });
      stops.push(() => nginx.stop());
      targets.push({ key: 'nginx', name: `nginx (${settings.pin ? `${settings.pin.proxy_cpus} worker(s)` : 'worker_processes auto'})`, url: `http://127.0.0.1:${nginx.port}/`, headers: {}, pid: nginx.pid });
    }
    for (const t of targets) await probe(t);

    const drive = (spec) => (haveWrk ? wrk({ ...spec, threads: settings.wrk_threads }) : measure(spec));
    for (let round = 1; round <= settings.rounds; round++) {
      // Alternated: each round starts one target later, so no target always runs first (or after the same one).
      const k = (round - 1) % targets.length;
      for (const t of [...targets.slice(k), ...targets.slice(0, k)]) {
        const spec = { name: t.name, url: t.url, headers: t.headers, connections: settings.connections };
        if (settings.warmup_s > 0) await drive({ ...spec, duration: settings.warmup_s });
        const cpu = cpuMeter(t.pid);
        const r = await drive({ ...spec, duration: settings.duration_s });
        const row = { target: t.key, name: t.name, round, rps: r.rps, requests: r.requests, latency_ms: r.latency_ms, errors: r.errors, non2xx: r.non2xx, cpu_us: cpu.per(r.requests) };
        rows.push(row);
        log(`round ${round} ${t.name}: ${row.rps} req/s, p99 ${row.latency_ms.p99} ms, proxy CPU ${row.cpu_us?.total ?? '?'} µs/request, errors ${row.errors}, non-2xx ${row.non2xx}`);
      }
    }
  } finally {
    for (const s of stops.reverse()) await s().catch((err) => log(`stop failed: ${err.message}`));
    rmSync(dir, { recursive: true, force: true });
  }

  const medians = ['node_floor', 'node_floor_obligations', 'poolgate', 'poolgate_before', 'nginx'].map((key) => {
    const g = rows.filter((r) => r.target === key);
    if (g.length === 0) return null;
    return {
      target: key,
      name: g[0].name,
      rounds: g.length,
      rps: median(g.map((r) => r.rps)),
      rps_each_round: g.map((r) => r.rps),
      p50_ms: median(g.map((r) => r.latency_ms.p50)),
      p99_ms: median(g.map((r) => r.latency_ms.p99)),
      cpu_us: median(g.map((r) => r.cpu_us?.total)),
      cpu_user_us: median(g.map((r) => r.cpu_us?.user)),
      cpu_system_us: median(g.map((r) => r.cpu_us?.system)),
      cpu_each_round: g.map((r) => r.cpu_us?.total ?? null),
      errors: g.reduce((a, r) => a + r.errors, 0),
      non2xx: g.reduce((a, r) => a + r.non2xx, 0),
    };
  }).filter(Boolean);
  const of = (key) => medians.find((r) => r.target === key);
  const floorRow = of('node_floor');
  const ratios = {
    poolgate_over_floor_rps: ratio(of('poolgate')?.rps, floorRow?.rps),
    poolgate_over_floor_cpu: ratio(of('poolgate')?.cpu_us, floorRow?.cpu_us),
    obligations_over_floor_rps: ratio(of('node_floor_obligations')?.rps, floorRow?.rps),
    obligations_over_floor_cpu: ratio(of('node_floor_obligations')?.cpu_us, floorRow?.cpu_us),
    poolgate_over_obligations_rps: ratio(of('poolgate')?.rps, of('node_floor_obligations')?.rps),
    poolgate_over_obligations_cpu: ratio(of('poolgate')?.cpu_us, of('node_floor_obligations')?.cpu_us),
    nginx_over_floor_rps: ratio(of('nginx')?.rps, floorRow?.rps),
    nginx_over_floor_cpu: ratio(of('nginx')?.cpu_us, floorRow?.cpu_us),
    before_over_floor_rps: ratio(of('poolgate_before')?.rps, floorRow?.rps),
    before_over_floor_cpu: ratio(of('poolgate_before')?.cpu_us, floorRow?.cpu_us),
  };
  ratios.rps_met = ratios.poolgate_over_floor_rps !== null && ratios.poolgate_over_floor_rps >= SATURATION_TARGET.rps_over_floor;
  ratios.cpu_met = ratios.poolgate_over_floor_cpu !== null && ratios.poolgate_over_floor_cpu <= SATURATION_TARGET.cpu_over_floor;
  for (const r of medians) if (r.errors || r.non2xx) notes.push(`${r.name}: ${r.errors} errors, ${r.non2xx} non-2xx over the rounds.`);
  m.loadavg_1m_end = Math.round(loadavg()[0] * 100) / 100;
  const date = new Date().toISOString();
  const report = { benchmark: 'proxy', mode: 'saturation', date, command, machine: m, settings, notes, rows, medians, ratios, target: SATURATION_TARGET };
  const path = writeJson(`proxy-saturation-${date.replace(/[:.]/g, '-')}.json`, report);
  writeJson('proxy-saturation-latest.json', report);
  log(`poolgate / floor: rps ${fmt(ratios.poolgate_over_floor_rps)} (target ≥ ${SATURATION_TARGET.rps_over_floor}), CPU per request ${fmt(ratios.poolgate_over_floor_cpu)} (target ≤ ${SATURATION_TARGET.cpu_over_floor}); nginx / floor: rps ${fmt(ratios.nginx_over_floor_rps)}, CPU ${fmt(ratios.nginx_over_floor_cpu)}`);
  if (WRITE_RESULTS) {
    writeMarkedSection('proxy-saturation', saturationSection(report), 'Proxy: saturation against the Node floor (issue 29)');
    log(`wrote ${path} and the bench:proxy-saturation section of bench/RESULTS.md`);
  } else {
    log(`wrote ${path} (RESULTS.md untouched: pass --write-results)`);
  }
  return report;
}

export function saturationSection(report) {
  const { settings: s, medians, ratios: q, notes } = report;
  const met = (ok) => (ok ? 'met' : '**missed**');
  return [
    `\`npm run bench:proxy -- --mode=saturation\` (bench/lib/proxy-saturation.mjs): one https origin on 127.0.0.2 (${s.origin}) behind`,
    'the Node floor (node:http + one undici Pool, nothing else), the same floor with the spec\'s per-request duties (`--obligations`:',
    'headers both ways with the forwarding headers, the X-Service-* headers, an access-log line a request), poolgate (`bin/poolgate.js start`, one data plane thread,',
    `default configuration but adaptive off and max_concurrent ${s.pool_max_concurrent}, access log to a file) and nginx (access log to a file),`,
    `driven at saturation by ${s.tool === 'wrk' ? `wrk \`-t${s.wrk_threads}\`` : 'autocannon'} over ${s.connections} keep-alive connections, ${s.duration_s} s per row after a ${s.warmup_s} s warm-up,`,
    `${s.rounds} rounds with the order of the targets rotated each round; each figure is the median over the rounds.`,
    s.pin
      ? `Pinned with taskset: every proxy on CPU ${s.pin.proxy}, the load generator, origin and driver on CPU ${s.pin.load}. CPU per request: user + system time of the proxy process (all threads; nginx: master and workers) per request answered.`
      : 'Not pinned. CPU per request: user + system time of the proxy process per request answered.',
    'Absolute rates do not carry between machines (issue 28 item 5); the ratios to the floor measured in the same run do.',
    '',
    provenance(report.machine, report.date, report.command),
    '',
    '| target | rps (median) | rps each round | p50 ms | p99 ms | proxy CPU µs/request (user / sys) | CPU each round | errors | non-2xx |',
    '|---|---:|---|---:|---:|---:|---|---:|---:|',
    ...medians.map((r) => `| ${r.name} | ${fmt(r.rps)} | ${r.rps_each_round.join(' / ')} | ${fmt(r.p50_ms)} | ${fmt(r.p99_ms)} | ${fmt(r.cpu_us)} (${fmt(r.cpu_user_us)} / ${fmt(r.cpu_system_us)}) | ${r.cpu_each_round.map(fmt).join(' / ')} | ${r.errors} | ${r.non2xx} |`),
    '',
    '| ratio to the Node floor | rps | CPU per request |',
    '|---|---:|---:|',
    `| poolgate | ${fmt(q.poolgate_over_floor_rps)} (target ≥ ${report.target.rps_over_floor}: ${met(q.rps_met)}) | ${fmt(q.poolgate_over_floor_cpu)} (target ≤ ${report.target.cpu_over_floor}: ${met(q.cpu_met)}) |`,
    ...(q.obligations_over_floor_rps !== null ? [`| Node floor + the spec's per-request duties | ${fmt(q.obligations_over_floor_rps)} | ${fmt(q.obligations_over_floor_cpu)} |`] : []),
    ...(q.before_over_floor_rps !== null ? [`| poolgate before (BENCH_BEFORE_ROOT) | ${fmt(q.before_over_floor_rps)} | ${fmt(q.before_over_floor_cpu)} |`] : []),
    `| nginx | ${fmt(q.nginx_over_floor_rps)} | ${fmt(q.nginx_over_floor_cpu)} |`,
    ...(q.poolgate_over_obligations_rps !== null
      ? ['', `poolgate against the floor with the spec's per-request duties (every header passed both ways with the forwarding headers, the X-Service-* headers, an access-log line per request; bench/lib/node-floor.mjs --obligations): rps ${fmt(q.poolgate_over_obligations_rps)}, CPU per request ${fmt(q.poolgate_over_obligations_cpu)}.`]
      : []),
    ...(notes.length ? ['', 'Notes:', '', ...notes.map((n) => `- ${n}`)] : []),
  ].join('\n');
}
