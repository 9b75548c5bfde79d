// CPU time per proxied request, one data plane thread against N on one port (issue 29: "with 2 threads on this
// 2-core machine, CPU per request within 10 % of one thread"), timed: the cross-check of
// `npm run bench:instructions -- --method=paced --threads=N`, which counts instructions instead.
// The same paced load (autocannon at --rate requests a second, --seconds long) goes to poolgate with one thread
// pinned to the proxy CPU and with N threads pinned to every CPU, rounds alternated; CPU per request is the proxy
// process's user + system time (every thread) over the requests answered. The load generator and the origin run on
// the other CPU (pinned); with N threads the proxy shares it with them, as it would on a real 2-core host.
// Usage: npm run bench:threads-cpu [-- --threads=2 --rate=1500 --seconds=10 --rounds=3 --connections=32 --warmup=3]
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { availableParallelism, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import autocannon from 'autocannon';
import { startPoolgateTarget, startTlsOrigin, probe } from './lib/proxy-targets.mjs';
import { cpuMeter } from './lib/cpu.mjs';
import { median } from './lib/proxy-bench-common.mjs';

const arg = (name, def) => process.argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? def;
const THREADS = Number(arg('threads', 2));
const RATE = Number(arg('rate', 1500));
const SECONDS = Number(arg('seconds', 10));
const ROUNDS = Number(arg('rounds', 3));
const CONNECTIONS = Number(arg('connections', 32));
// Seconds of paced load on each target before the rounds. Every thread is an isolate that compiles its own code:
// with 3 s, the first rounds still carried the optimizing compiler's background work (V8Worker 36–56 µs a request
// against 3–19 from the third round on, 2026-11-29), twice over with two threads.
const WARMUP = Number(arg('warmup', 3));
// --many-pin=<cpus>: where the N threads run (default every CPU); the proxy CPU alone separates the threads' own
// cost from that of sharing the cores with the load generator and origin.
const MANY_PIN = arg('many-pin', null);
/** CPU ticks of each thread of `pid`, summed by thread name (MainThread, WorkerThread, V8Worker, libuv-worker…). */
function ticksByThread(pid) {
  const out = {};
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      const comm = readFileSync(`/proc/${pid}/task/${tid}/comm`, 'utf8').trim();
      const f = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8').split(') ')[1].split(' ');
      out[comm] = (out[comm] ?? 0) + Number(f[11]) + Number(f[12]);
    } catch {
      /* the thread ended */
    }
  }
  return out;
}

const log = (m) => process.stderr.write(`[threads-cpu] ${m}\n`);

async function main() {
  const cpus = availableParallelism();
  if (cpus < 2) throw new Error('needs two CPUs: one for the load generator and origin, the other for the one-thread proxy');
  const last = String(cpus - 1);
  const rest = cpus === 2 ? '0' : `0-${cpus - 2}`;
  const all = `0-${cpus - 1}`;
  execFileSync('taskset', ['-a', '-c', '-p', rest, String(process.pid)], { stdio: 'ignore' });
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-threads-cpu-'));
  const stops = [];
  const rows = { one: [], many: [] };
  try {
    const { origin, certFile, originUrl } = await startTlsOrigin(dir, '127.0.0.1', { pin: rest });
    stops.push(() => origin.stop());
    const one = await startPoolgateTarget(originUrl, certFile, dir, { maxConcurrent: 1000, pin: last });
    stops.push(() => one.stop());
    const many = await startPoolgateTarget(originUrl, certFile, dir, { maxConcurrent: 1000, pin: MANY_PIN ?? all, threads: THREADS });
    stops.push(() => many.stop());
    for (const t of [one, many]) {
      await probe({ name: 'poolgate', ...t });
      // Warm-up: JIT and origin connections in every thread.
      await autocannon({ url: t.url, headers: t.headers, connections: CONNECTIONS, duration: WARMUP, overallRate: RATE });
    }
    for (let i = 0; i < ROUNDS; i++) {
      // Alternate which goes first, so a change in the machine's load over the run falls on both.
      const order = i % 2 === 0 ? [['one', one], ['many', many]] : [['many', many], ['one', one]];
      for (const [key, t] of order) {
        const load = loadavg()[0];
        const cpu = cpuMeter(t.pid);
        const before = ticksByThread(t.pid);
        const r = await autocannon({ url: t.url, headers: t.headers, connections: CONNECTIONS, duration: SECONDS, overallRate: RATE });
        const n = Number(r.statusCodeStats?.['200']?.count ?? 0);
        const per = cpu.per(n);
        rows[key].push(per.total);
        // Where the time went, by thread name, µs a request (clock ticks of 10 ms: a coarse split).
        const after = ticksByThread(t.pid);
        const split = Object.entries(after).map(([name, v]) => `${name} ${Math.round(((v - (before[name] ?? 0)) * 10_000) / n)}`).join(', ');
        log(`  by thread, µs a request: ${split}`);
        log(`round ${i + 1} ${key === 'one' ? '1 thread' : `${THREADS} threads`}: ${n} requests, ${per.total} µs CPU a request (user ${per.user}, system ${per.system}), load average ${load.toFixed(1)}`);
      }
    }
  } finally {
    for (const s of stops.reverse()) await s().catch((err) => log(`stop failed: ${err.message}`));
    rmSync(dir, { recursive: true, force: true });
  }
  const m1 = median(rows.one);
  const mN = median(rows.many);
  const perRound = rows.one.map((x, i) => Math.round((100 * rows.many[i]) / x) / 100);
  // Each round's two rows ran back to back: their ratio drifts less with the machine's load than the medians do.
  log(`median ${m1} µs (1 thread) → ${mN} µs (${THREADS} threads): ${(mN / m1).toFixed(2)}×; per round ${perRound.join(', ')} (median ${median(perRound)})`);
  console.log(JSON.stringify({ date: new Date().toISOString(), node: process.version, threads: THREADS, rate: RATE, seconds: SECONDS, connections: CONNECTIONS, one_us: rows.one, many_us: rows.many, ratio: Math.round((100 * mN) / m1) / 100, per_round: perRound, per_round_median: median(perRound) }));
}

await main();
