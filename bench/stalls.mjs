// What stalls poolgate's data plane thread (issue 29's tail): poolgate (every role, embedded store, one data
// plane thread, as bench:proxy --mode=tail runs it) with bench/lib/loop-probe.mjs preloaded, measured over two
// windows: idle (no requests) and paced load (open loop through `poolgate demo-origin`). Per window: the event
// loop's delay (monitorEventLoopDelay, 1 ms resolution), its utilisation, the garbage collections, and each
// embedded-store statement run on the thread (the synchronous WebAssembly call, labelled by its SQL); for the
// load window also the paced latencies. With --callgrind, each build's idle instruction rate too (a process under
// callgrind without the probe, its counters zeroed after start-up, counted over --idle seconds): instructions do
// not depend on what else the shared machine runs, the timings above do.
// --before=<built checkout> measures that build too, the two alternating round by round (--rounds, default 1).
// Usage: npm run bench:stalls [-- --idle=20 --load=20 --rate=2000 --connections=32 --rounds=1 --settle=40 --callgrind --no-probe --before=<dir> --write-results]
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { paced } from './lib/paced.mjs';
import { probe, startDemoOrigin, startPoolgateTarget } from './lib/proxy-targets.mjs';
import { root } from './lib/poolgate.mjs';
import { callgrindControl, callgrindWrap, dumpIr } from './lib/callgrind.mjs';
import { benchCommand, machine, writeJson, writeResults } from './lib/results.mjs';

const arg = (name, def) => process.argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? def;
const IDLE_S = Number(arg('idle', 20));
const LOAD_S = Number(arg('load', 20));
const RATE = Number(arg('rate', 2000));
const CONNECTIONS = Number(arg('connections', 32));
const ROUNDS = Number(arg('rounds', 1));
const CALLGRIND = process.argv.includes('--callgrind');
// Without --no-probe, the probed windows (loop delay, GC, statements, paced load) run too.
const PROBED = !process.argv.includes('--no-probe');
// Seconds after start-up before the idle window: V8's memory reducer runs its few major collections in the first
// half-minute of an idle process, and they would be counted as the process's steady idle work.
const SETTLE_S = Number(arg('settle', 40));
const BEFORE = arg('before', null);
const PROBE = join(root, 'bench', 'lib', 'loop-probe.mjs');
const log = (m) => process.stderr.write(`[stalls] ${m}\n`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The probe's window since its last SIGUSR2 (the line it appends to `file`). */
async function window(pid, file) {
  const had = existsSync(file) ? readFileSync(file, 'utf8').split('\n').filter(Boolean).length : 0;
  process.kill(pid, 'SIGUSR2');
  for (let i = 0; i < 200; i++) {
    await sleep(25);
    const lines = existsSync(file) ? readFileSync(file, 'utf8').split('\n').filter(Boolean) : [];
    if (lines.length > had) return JSON.parse(lines.at(-1));
  }
  throw new Error(`no probe line from ${pid}`);
}

const rssMb = (pid) => Math.round(Number(/^VmRSS:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]) / 1024);

/** One build's idle and paced windows, the probe preloaded. */
async function probed(build, bin, origin, dir) {
  const out = join(dir, `probe-${build}-${Date.now()}.jsonl`);
  const t = await startPoolgateTarget(origin.url, origin.caFile, dir, { bin, maxConcurrent: 10_000, nodeArgs: ['--import', PROBE], env: { LOOP_PROBE_OUT: out } });
  try {
    await probe({ name: build, url: t.url, headers: t.headers });
    // Start-up's own work (the first snapshot, the pool's set-up, the memory reducer's collections) settles, then
    // the idle window starts.
    await sleep(SETTLE_S * 1000);
    await window(t.pid, out);
    await sleep(IDLE_S * 1000);
    const idle = await window(t.pid, out);
    idle.rss_mb = rssMb(t.pid);
    const spec = { name: build, url: t.url, headers: t.headers, rate: RATE, connections: CONNECTIONS };
    await paced({ ...spec, duration: 3 });
    await window(t.pid, out);
    const r = await paced({ ...spec, duration: LOAD_S });
    const load = await window(t.pid, out);
    load.paced = r.latency_ms;
    load.rps = r.rps;
    return { idle, load };
  } finally {
    await t.stop();
  }
}

/** One build's idle instructions per second under callgrind (no probe): in all, in the store's WebAssembly, in collections. */
async function idleInstructions(build, bin, origin, dir) {
  const cgDir = join(dir, `cg-${build}-${Date.now()}`);
  execFileSync('mkdir', ['-p', cgDir]);
  const t = await startPoolgateTarget(origin.url, origin.caFile, dir, { bin, maxConcurrent: 10_000, wrap: callgrindWrap(cgDir) });
  try {
    await probe({ name: build, url: t.url, headers: t.headers });
    callgrindControl(t.pid, '-i', 'on');
    await sleep(SETTLE_S * 1000);
    callgrindControl(t.pid, '-z');
    const t0 = Date.now();
    await sleep(IDLE_S * 1000);
    // Besides the total (every thread): the collections' atomic pauses on the main thread, which land in a window
    // or not. (The store's WebAssembly cannot be told apart: once warm, V8 calls it through compiled wrappers that
    // callgrind cannot name.)
    const parts = { names: ['v8::internal::Heap::CollectGarbage'] };
    const ir = dumpIr(cgDir, t.pid, null, parts);
    const s = (Date.now() - t0) / 1000;
    return { total: Math.round(ir / s), gc_pauses: Math.round(parts.ir['v8::internal::Heap::CollectGarbage'] / s) };
  } finally {
    await t.stop();
  }
}

const summary = (w) => ({
  loop_delay_ms: w.loop_delay_ms,
  loop_utilisation: w.loop_utilisation,
  gc: w.gc,
  store: { calls: w.store.calls, totalMs: w.store.totalMs, maxMs: w.store.maxMs },
  ...(w.paced ? { paced_ms: w.paced, rps: w.rps } : {}),
  ...(w.rss_mb ? { rss_mb: w.rss_mb } : {}),
});

const cell = (v) => (v === undefined || v === null ? '–' : typeof v === 'number' ? v.toLocaleString('en') : String(v));

/** The RESULTS.md section: one row per build and round. */
function section(results) {
  const rows = results.map((r) => {
    const gc = r.load?.gc?.minor;
    return `| ${r.build} | ${r.round} | ${r.loadavg_1m} | ${cell(r.idle?.store.calls)} | ${cell(r.idle?.store.totalMs)} | ${cell(r.idle?.loop_delay_ms.p99)} / ${cell(r.idle?.loop_delay_ms.max)} | ${cell(r.load?.store.calls)} | ${cell(r.load?.store.totalMs)} (${cell(r.load?.store.maxMs)}) | ${gc ? `${gc.count}, ${gc.totalMs} (${gc.maxMs})` : '–'} | ${cell(r.load?.loop_delay_ms.p99)} / ${cell(r.load?.loop_delay_ms.max)} | ${cell(r.load?.paced?.p99)} / ${cell(r.load?.paced?.p999)} | ${r.idle_instructions_per_s ? `${cell(r.idle_instructions_per_s.total)} (${cell(r.idle_instructions_per_s.gc_pauses)})` : '–'} |`;
  });
  return [
    `Settings: ${SETTLE_S} s after start-up, an idle window of ${IDLE_S} s, then ${LOAD_S} s paced at ${RATE} req/s over ${CONNECTIONS} connections (after 3 s of warm-up); every role on the embedded store, one data plane thread. Store: PGlite calls on the event loop (each statement is 1–5: parse, bind, describe, execute, sync) and the time in them; times in ms.`,
    '',
    '| build | round | load avg | idle: store calls | idle: store ms | idle: loop delay p99 / max | paced: store calls | paced: store ms (longest) | paced: scavenges, ms (longest) | paced: loop delay p99 / max | paced: latency p99 / p99.9 | idle instructions/s under callgrind (in collection pauses) |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...rows,
  ].join('\n');
}

async function main() {
  // BENCH_SECTION_FROM=<report.json> (bench/out/stalls-*.json) rewrites the section from a saved run without measuring.
  if (process.env.BENCH_SECTION_FROM) {
    const report = JSON.parse(readFileSync(process.env.BENCH_SECTION_FROM, 'utf8'));
    writeResults('stalls', 'Stalls of the data plane thread (issue 29)', section(report.results), { command: report.command, m: report.machine, date: report.date });
    return;
  }
  const m = machine();
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-stalls-'));
  const builds = [['this', undefined], ...(BEFORE ? [['before', join(BEFORE, 'bin', 'poolgate.js')]] : [])];
  const results = [];
  const origin = await startDemoOrigin(join(dir, 'demo-origin'));
  try {
    for (let round = 1; round <= ROUNDS; round++) {
      // Alternate which build goes first, so neither always meets the machine in the same state.
      const order = round % 2 === 1 ? builds : [...builds].reverse();
      for (const [build, bin] of order) {
        log(`round ${round}: ${build} (load average ${loadavg()[0].toFixed(2)})`);
        const row = { build, round, loadavg_1m: Math.round(loadavg()[0] * 100) / 100, ...(PROBED ? await probed(build, bin, origin, dir) : {}) };
        if (CALLGRIND) row.idle_instructions_per_s = await idleInstructions(build, bin, origin, dir);
        results.push(row);
        log(`${build}: ${JSON.stringify({ idle: row.idle && summary(row.idle), load: row.load && summary(row.load), idle_instructions_per_s: row.idle_instructions_per_s })}`);
        if (PROBED) for (const [name, w] of [['idle', row.idle], ['load', row.load]]) {
          for (const s of w.store.statements.slice(0, 8)) log(`  ${name}: ${s.count}× ${s.totalMs} ms (max ${s.maxMs}) ${s.label}`);
        }
      }
    }
  } finally {
    await origin.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  m.loadavg_1m_end = Math.round(loadavg()[0] * 100) / 100;
  const report = { benchmark: 'stalls', date: new Date().toISOString(), command: benchCommand('npm run bench:stalls'), machine: m, node: process.version, settings: { idle_s: IDLE_S, load_s: LOAD_S, rate: RATE, connections: CONNECTIONS, rounds: ROUNDS, settle_s: SETTLE_S }, results };
  writeJson(`stalls-${report.date.replace(/[:.]/g, '-')}.json`, report);
  writeResults('stalls', 'Stalls of the data plane thread (issue 29)', section(results), { command: report.command, m, date: report.date });
  console.log(JSON.stringify(results.map((r) => ({ build: r.build, round: r.round, loadavg_1m: r.loadavg_1m, idle: r.idle && summary(r.idle), load: r.load && summary(r.load), idle_instructions_per_s: r.idle_instructions_per_s }))));
}

await main();
