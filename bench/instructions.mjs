// Instructions per proxied request (issue 29's CPU-per-request target, counted instead of timed): poolgate and the
// Node floor (bench/lib/node-floor.mjs) each run under valgrind's callgrind in front of the same https origin;
// after a warm-up, the counters are zeroed, a fixed number of requests is sent (autocannon -a), and the proxy's
// instructions (Ir, every thread of the process) are divided by the requests. Instruction counts do not depend on
// what else the machine runs, so the ratio is repeatable on a shared 2-core box where CPU time and rps are not.
// They are not time: cache misses, syscalls' kernel work and valgrind's serialised threads are left out.
// Usage: npm run bench:instructions [-- --requests=2000 --warmup=1500 --connections=16 --idle=10 --targets=poolgate,node_floor --before=<built checkout> --keep=<dir> --write-results]
//
// --method=paced (the per-request figure with the idle work cancelled, not estimated): a process's background work
// (timers, polls, resyncs) goes with wall time, and at full speed time goes with the requests, so two counts at
// full speed cannot tell one from the other. Two windows of the same wall time can: one paced at --rate requests a
// second, the other at full speed, each --window seconds, alternated --pairs times; per request =
// (Ir(full) − Ir(paced)) / (n(full) − n(paced)), the background work of equal windows cancelling. Median of the
// pairs. (Under callgrind the proxy serves ~50–100 requests a second, fewer on a loaded machine: keep --rate well
// below that.)
// Usage: npm run bench:instructions -- --method=paced [--rate=5 --window=30 --pairs=3]
//
// --threads=N (issue 29's "with 2 threads, CPU per request within 10 % of one thread"): poolgate with one data plane
// thread (poolgate) and with N on one port (poolgate_threadsN, the kernel spreading the connections), same load, same
// method; callgrind runs the threads one at a time but counts every thread's instructions, so the ratio is what the
// second thread's sharing (shared governor, record batches to the main thread, per-thread background work) costs.
// Usage: npm run bench:instructions -- --method=paced --threads=2 [--write-results]
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import autocannon from 'autocannon';
import { startTlsOrigin, startNodeFloor, startPoolgateTarget, probe } from './lib/proxy-targets.mjs';
import { callgrindControl, callgrindWrap, dumpIr } from './lib/callgrind.mjs';
import { writeMarkedSection } from './lib/results.mjs';

const arg = (name, def) => process.argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? def;
const REQUESTS = Number(arg('requests', 2000));
const WARMUP = Number(arg('warmup', 1500));
const CONNECTIONS = Number(arg('connections', 16));
const IDLE_S = Number(arg('idle', 10));
const THREADS = Number(arg('threads', 1));
const THREADED = `poolgate_threads${THREADS}`;
const TARGETS = arg(
  'targets',
  THREADS > 1 ? `poolgate,${THREADED}` : process.argv.some((a) => a.startsWith('--before=')) ? 'poolgate_before,poolgate,node_floor' : 'poolgate,node_floor',
).split(',');
const WRITE = process.argv.includes('--write-results');
// --keep=<dir>: the callgrind dumps are copied there (callgrind_annotate shows the native functions; JIT code is unnamed);
// with --method=paced each window's too, in <dir>/<target>-<paced|full>-<window number>-<its requests>/.
const KEEP = arg('keep', null);
// --before=<dir>: another build (its bin/poolgate.js, built) measured too, as poolgate_before: a change's before and after in one run.
const BEFORE = arg('before', null);
const METHOD = arg('method', 'amount');
const RATE = Number(arg('rate', 5));
const WINDOW_S = Number(arg('window', 30));
const PAIRS = Number(arg('pairs', 3));
// --high=<rate>: the second window paced at this rate instead of full speed. On the loaded 2-core machine (load
// average 12–22, two callgrind runs at once) full-speed windows served fewer requests than paced ones (one thread
// 104 against 140 in 30 s, two threads 9 and 50 against 126 and 139): the difference of a pair then means nothing.
// Two paced rates keep both windows moving, and give both targets about the same requests per window.
const HIGH = arg('high', null) === null ? null : Number(arg('high', null));
const log = (m) => process.stderr.write(`[instructions] ${m}\n`);

/** Sends exactly n requests; throws unless every one answered 200. */
async function send(url, headers, n) {
  const r = await autocannon({ url, connections: CONNECTIONS, amount: n, timeout: 120, headers });
  const ok = Number(r.statusCodeStats?.['200']?.count ?? 0);
  if (ok !== n || r.errors > 0) throw new Error(`${url}: ${ok}/${n} answered 200, ${r.errors} errors, ${r.timeouts} timeouts`);
  return ok;
}

/** Sends requests for `seconds`, paced at `rate` a second over every connection (null: as fast as answered); the count answered 200. */
async function sendFor(url, headers, rate, seconds) {
  const r = await autocannon({ url, connections: CONNECTIONS, duration: seconds, ...(rate === null ? {} : { overallRate: rate }), timeout: 120, headers });
  const ok = Number(r.statusCodeStats?.['200']?.count ?? 0);
  if (ok === 0 || ok < 0.95 * (ok + r.non2xx + r.errors)) throw new Error(`${url}: ${ok} answered 200, ${r.non2xx} others, ${r.errors} errors, ${r.timeouts} timeouts`);
  // Every answer was work (a rare 5xx on a starved machine too): counted; said when there were any.
  if (r.non2xx + r.errors > 0) log(`${url}: ${r.non2xx} answers other than 200 and ${r.errors} errors among ${ok + r.non2xx} (counted)`);
  return ok + r.non2xx;
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

let windowNo = 0;

/**
 * What a window spends compiling, by callgrind's inclusive count: V8's optimising compilers (TurboFan's jobs, Maglev's),
 * on background threads. Under callgrind the proxy runs ~50× slower, so tiering up is not done after the warm-up: in
 * this bench's runs TurboFan alone was 97,000 (floor) to 170,000 (poolgate) instructions a request, a third of
 * poolgate's full-speed window, and it is what spread the pairs; a process at full speed is done with it in its
 * first seconds. Collections stay in the figure (they are the requests' own cost, though more frequent under
 * callgrind: one scavenge every 40–80 requests, against one every ~700 outside it, bench/alloc.mjs).
 */
const COMPILERS = ['v8::internal::OptimizedCompilationJob::ExecuteJob', 'v8::internal::maglev::MaglevConcurrentDispatcher::JobTask::Run'];

/** One window: counters zeroed, requests for WINDOW_S seconds at `rate` (null: full speed); its Ir, requests, and Ir less COMPILERS. */
async function countWindow(cgDir, target, rate) {
  callgrindControl(target.pid, '-z');
  const n = await sendFor(target.url, target.headers, rate, WINDOW_S);
  // --keep: each window's dumps too, named by window (callgrind_annotate per window; divide by its requests).
  const keep = KEEP ? join(KEEP, `${target.key}-${rate === null ? 'full' : 'paced'}-${++windowNo}-${n}`) : null;
  if (keep) mkdirSync(keep, { recursive: true });
  const parts = { names: COMPILERS };
  const ir = dumpIr(cgDir, target.pid, keep, parts);
  const compiling = Object.values(parts.ir).reduce((a, b) => a + b, 0);
  return { ir, n, mutatorIr: ir - compiling };
}

async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-instr-'));
  // The idle window's dump is copied into KEEP before any window's folder exists: a missing KEEP became a file.
  if (KEEP) mkdirSync(KEEP, { recursive: true });
  const cgDir = join(dir, 'cg');
  execFileSync('mkdir', ['-p', cgDir]);
  // Both targets under the same fair thread lock when one has several data plane threads.
  // Off until the target is up (start-up under instrumentation would take minutes); a dump holds every thread.
  const wrap = callgrindWrap(cgDir, THREADS > 1);
  const stops = [];
  const rows = [];
  try {
    const { origin, certFile, originUrl } = await startTlsOrigin(dir, '127.0.0.1');
    stops.push(() => origin.stop());
    for (const key of TARGETS) {
      const t0 = Date.now();
      const target =
        key === 'poolgate' ? await startPoolgateTarget(originUrl, certFile, dir, { maxConcurrent: 1000, wrap })
        : key === THREADED && THREADS > 1 ? await startPoolgateTarget(originUrl, certFile, dir, { maxConcurrent: 1000, wrap, threads: THREADS })
        : key === 'poolgate_before' && BEFORE ? await startPoolgateTarget(originUrl, certFile, dir, { maxConcurrent: 1000, wrap, bin: join(BEFORE, 'bin', 'poolgate.js') })
        : key === 'node_floor' ? await startNodeFloor(originUrl, certFile, undefined, wrap).then((f) => ({ ...f, url: `http://127.0.0.1:${f.port}/`, headers: {} }))
        : null;
      if (!target) throw new Error(`unknown target ${key}`);
      target.key = key;
      stops.push(() => target.stop());
      log(`${key} up under valgrind in ${((Date.now() - t0) / 1000).toFixed(0)} s (pid ${target.pid})`);
      await probe({ name: key, url: target.url, headers: target.headers });
      callgrindControl(target.pid, '-i', 'on');
      // The process with no requests, before any load (so no collection the load caused lands here): timers and
      // background work (snapshot resync, metrics, jobs and webhook polls on the store), per second of wall time.
      // Valgrind's slowdown spreads each second's background work over far fewer requests than a real second
      // serves, so the raw figure overstates it; the figure less this rate is the request's own work.
      callgrindControl(target.pid, '-z');
      const i0 = Date.now();
      await new Promise((r) => setTimeout(r, IDLE_S * 1000));
      const idlePerS = dumpIr(cgDir, target.pid, KEEP) / ((Date.now() - i0) / 1000);
      if (METHOD === 'paced') {
        // The warm-up only has to warm: a stray non-200 on a starved machine is no reason to start over.
        await send(target.url, target.headers, WARMUP).catch((err) => log(`warm-up: ${err.message}`));
        const perRequest = [];
        const mutatorPerRequest = [];
        for (let i = 0; i < PAIRS; i++) {
          // Alternate which window goes first, so a drift over the run falls on both.
          const lo = i % 2 === 0 ? await countWindow(cgDir, target, RATE) : null;
          const hi = await countWindow(cgDir, target, HIGH);
          const low = lo ?? (await countWindow(cgDir, target, RATE));
          const pr = (hi.ir - low.ir) / (hi.n - low.n);
          const mr = (hi.mutatorIr - low.mutatorIr) / (hi.n - low.n);
          perRequest.push(pr);
          mutatorPerRequest.push(mr);
          log(`${key} pair ${i + 1}: paced ${low.n} requests ${low.ir} Ir, ${HIGH === null ? "full speed" : `at ${HIGH}/s`} ${hi.n} requests ${hi.ir} Ir (${WINDOW_S} s each): ${Math.round(pr)} per request, ${Math.round(mr)} less JIT compilation`);
        }
        callgrindControl(target.pid, '-i', 'off');
        const row = { target: key, method: 'paced', pairs: perRequest.map(Math.round), ir_per_request: Math.round(median(perRequest)), mutator_pairs: mutatorPerRequest.map(Math.round), mutator_ir_per_request: Math.round(median(mutatorPerRequest)), idle_ir_per_s: Math.round(idlePerS) };
        rows.push(row);
        log(`${key}: ${row.ir_per_request} instructions per request, ${row.mutator_ir_per_request} less JIT compilation (median of ${PAIRS} pairs, ${WINDOW_S} s windows at ${RATE}/s and at ${HIGH === null ? "full speed" : `${HIGH}/s`})`);
        await target.stop();
        stops.pop();
        continue;
      }
      await send(target.url, target.headers, WARMUP);
      callgrindControl(target.pid, '-z');
      const t1 = Date.now();
      const n = await send(target.url, target.headers, REQUESTS);
      const ir = dumpIr(cgDir, target.pid, KEEP);
      const seconds = (Date.now() - t1) / 1000;
      const idle = Math.round(idlePerS * seconds);
      callgrindControl(target.pid, '-i', 'off');
      const row = { target: key, requests: n, ir, ir_per_request: Math.round(ir / n), idle_ir: idle, busy_ir_per_request: Math.round((ir - idle) / n), seconds };
      rows.push(row);
      log(`${key}: ${row.ir_per_request} instructions per request, ${row.busy_ir_per_request} less the idle process's (${n} requests, ${seconds} s under callgrind)`);
      await target.stop();
      stops.pop();
    }
  } finally {
    for (const s of stops.reverse()) await s().catch((err) => log(`stop failed: ${err.message}`));
    rmSync(dir, { recursive: true, force: true });
  }
  const pg = rows.find((r) => r.target === 'poolgate');
  const floor = rows.find((r) => r.target === 'node_floor');
  const ratio = pg && floor ? Math.round((100 * pg.ir_per_request) / floor.ir_per_request) / 100 : null;
  const mutatorRatio = pg && floor && METHOD === 'paced' ? Math.round((100 * pg.mutator_ir_per_request) / floor.mutator_ir_per_request) / 100 : null;
  const busyRatio = pg && floor && METHOD !== 'paced' ? Math.round((100 * pg.busy_ir_per_request) / floor.busy_ir_per_request) / 100 : null;
  const label = process.env.BENCH_LABEL ?? '';
  const one = rows.find((r) => r.target === 'poolgate');
  const many = rows.find((r) => r.target === THREADED);
  const threadRatio = one && many ? Math.round((100 * many.ir_per_request) / one.ir_per_request) / 100 : null;
  if (THREADS > 1) log(`${THREADED} / poolgate: ${threadRatio} (target ≤ 1.10)`);
  console.log(JSON.stringify({ label, date: new Date().toISOString(), node: process.version, requests: REQUESTS, warmup: WARMUP, connections: CONNECTIONS, rows, poolgate_over_node_floor: ratio, less_jit_poolgate_over_node_floor: mutatorRatio, busy_poolgate_over_node_floor: busyRatio, threads_over_one: threadRatio }));
  if (WRITE && THREADS > 1) {
    const how =
      METHOD === 'paced'
        ? `${WARMUP} warm-up requests, then ${PAIRS} pairs of ${WINDOW_S} s windows, one at ${RATE} requests a second and one at ${HIGH === null ? 'full speed' : `${HIGH} a second`}; per request = the difference of a pair's instructions over the difference of its requests (background work cancels); median of the pairs`
        : `${WARMUP} warm-up requests, then ${REQUESTS} counted`;
    const cell = (r) => (r.pairs ? r.pairs.map((x) => x.toLocaleString('en')).join(', ') : `${r.requests} requests`);
    const lines = [
      `Instructions per proxied request, one data plane thread against ${THREADS} on one port (\`npm run bench:instructions -- --method=${METHOD} --threads=${THREADS}${HIGH === null ? '' : ` --rate=${RATE} --high=${HIGH}`}\`, ${new Date().toISOString().slice(0, 10)}, Node ${process.version}${label ? `, ${label}` : ''}):`,
      `${how}; ${CONNECTIONS} keep-alive connections (the kernel spreads them over the threads), small GET through to the https origin; every thread of the proxy process (callgrind runs them one at a time and counts them all).`,
      '',
      '| target | instructions per request | / one thread | each pair | idle instructions per second |',
      '| --- | ---: | ---: | --- | ---: |',
      ...rows.map((r) => `| ${r.target} | ${r.ir_per_request.toLocaleString('en')} | ${one ? (r.ir_per_request / one.ir_per_request).toFixed(2) : '—'} | ${cell(r)} | ${Math.round(r.idle_ir_per_s ?? r.idle_ir / r.seconds).toLocaleString('en')} |`),
    ];
    writeMarkedSection('instructions-threads', lines.join('\n'), 'Proxy: instructions per request, one thread against several (issue 29)');
  } else if (WRITE && METHOD === 'paced') {
    const lines = [
      `Instructions per proxied request, background work cancelled (\`npm run bench:instructions -- --method=paced\`, ${new Date().toISOString().slice(0, 10)}, Node ${process.version}${label ? `, ${label}` : ''}):`,
      `${WARMUP} warm-up requests, then ${PAIRS} pairs of ${WINDOW_S} s windows, one at ${RATE} requests a second and one at full speed, over ${CONNECTIONS} keep-alive connections, small GET through to the https origin; per request = the difference of a pair's instructions over the difference of its requests (the background work of equal windows cancels); every thread of the proxy process.`,
      '',
      '| target | instructions per request (median) | / Node floor | each pair | less JIT compilation (median) | / Node floor | each pair | idle instructions per second |',
      '| --- | ---: | ---: | --- | ---: | ---: | --- | ---: |',
      ...rows.map(
        (r) =>
          `| ${r.target} | ${r.ir_per_request.toLocaleString('en')} | ${floor ? (r.ir_per_request / floor.ir_per_request).toFixed(2) : '—'} | ${r.pairs.map((x) => x.toLocaleString('en')).join(', ')} | ` +
          `${r.mutator_ir_per_request.toLocaleString('en')} | ${floor ? (r.mutator_ir_per_request / floor.mutator_ir_per_request).toFixed(2) : '—'} | ${r.mutator_pairs.map((x) => x.toLocaleString('en')).join(', ')} | ${r.idle_ir_per_s.toLocaleString('en')} |`,
      ),
    ];
    writeMarkedSection('instructions-paced', lines.join('\n'), 'Proxy: instructions per request, background work cancelled (issue 29)');
  } else if (WRITE) {
    const lines = [
      `Instructions per proxied request under callgrind (\`npm run bench:instructions\`, ${new Date().toISOString().slice(0, 10)}, Node ${process.version}${label ? `, ${label}` : ''}):`,
      `${WARMUP} warm-up requests, then ${REQUESTS} counted, ${CONNECTIONS} keep-alive connections, small GET through to the https origin; every thread of the proxy process.`,
      '',
      '| target | instructions per request | / Node floor | less the idle process\'s rate over the same wall time | / Node floor | idle instructions per second |',
      '| --- | ---: | ---: | ---: | ---: | ---: |',
      ...rows.map((r) => `| ${r.target} | ${r.ir_per_request.toLocaleString('en')} | ${floor ? (r.ir_per_request / floor.ir_per_request).toFixed(2) : '—'} | ${r.busy_ir_per_request.toLocaleString('en')} | ${floor ? (r.busy_ir_per_request / floor.busy_ir_per_request).toFixed(2) : '—'} | ${Math.round(r.idle_ir / r.seconds).toLocaleString('en')} |`),
    ];
    writeMarkedSection('instructions', lines.join('\n'), 'Instructions per request');
  }
}

await main();
