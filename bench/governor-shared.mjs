// bench:governor-shared — acquire+release pairs per second of the shared-memory governor (SharedArrayBuffer +
// Atomics, for the multi-threaded data plane) against the memory governor, in one run:
//   1. one thread, synchronous pairs: memory vs shared (alternating rounds, medians, ratio side by side);
//   2. one vs two threads of synchronous pairs on the shared governor (one pool, then one pool per thread);
//   3. hand-overs: a pool of 4 slots, 64 waiting acquires in one thread (memory, shared) vs 32 in each of
//      two threads (shared), every release handing its slot to a queued waiter, possibly in the other thread.
// Run: npm run bench:governor-shared   (env BENCH_SECONDS per timed phase, default 3; ROUNDS, default 3;
// -- --write-results rewrites the bench:governor-shared section of bench/RESULTS.md)
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import { loadavg } from 'node:os';
import { MemoryGovernor } from '../dist/src/governor/memory.js';
import { SharedMemoryGovernor } from '../dist/src/governor/shared-memory.js';
import { benchCommand, machine, writeJson, writeResults } from './lib/results.mjs';

const SECONDS = Number(process.env.BENCH_SECONDS ?? 3);
const ROUNDS = Number(process.env.ROUNDS ?? 3);
const PAIRS = 2_000_000;
const HANDOFF_SLOTS = 4;
const limits = (poolId, maxConcurrent = 1_000_000) => ({ poolId, maxConcurrent, queueLength: 100_000, queueTimeoutMs: 60_000, budgetId: null, reservedConcurrent: 0 });

/** Synchronous acquire+release pairs for `ms` (or `count` pairs); returns pairs per second. */
function syncPairs(gov, poolId, { ms, count }) {
  for (let i = 0; i < 50_000; i++) gov.acquire({ poolId, waitMs: 0 }).permit.release(); // warm-up
  const start = performance.now();
  let n = 0;
  for (;;) {
    for (let i = 0; i < 1024; i++) {
      const a = gov.acquire({ poolId, waitMs: 0 });
      if (a instanceof Promise || !a.ok) throw new Error('expected a free slot');
      a.permit.release();
    }
    n += 1024;
    if (count !== undefined ? n >= count : performance.now() - start >= ms) break;
  }
  return n / ((performance.now() - start) / 1000);
}

/** `loops` acquire(wait)+release loops on a small pool for `ms`: every admission past the first few is a hand-over. */
async function handoffs(gov, poolId, loops, ms) {
  let n = 0;
  let refused = 0;
  const until = performance.now() + ms;
  const loop = async () => {
    while (performance.now() < until) {
      const a = await gov.acquire({ poolId, waitMs: 30_000 });
      if (!a.ok) {
        refused++;
        continue;
      }
      // Yield once while holding the slot, as a real request would, so that waiters queue up behind it.
      await null;
      a.permit.release();
      n++;
    }
  };
  const start = performance.now();
  await Promise.all(Array.from({ length: loops }, loop));
  return { perSec: n / ((performance.now() - start) / 1000), refused };
}

/** Runs `n` workers against `gov` at once; returns the sum of their rates. */
async function inWorkers(gov, n, mode, poolIdOf, extra = {}) {
  const go = new SharedArrayBuffer(4);
  const handles = Array.from({ length: n }, () => gov.handle());
  const workers = handles.map((handle, i) => new Worker(new URL(import.meta.url), { workerData: { handle, mode, poolId: poolIdOf(i), go, ms: SECONDS * 1000, ...extra } }));
  const exits = workers.map((w) => new Promise((r) => w.once('exit', r)));
  const results = workers.map((w) => new Promise((resolve, reject) => {
    w.on('message', (m) => { if (!m.ready) resolve(m); });
    w.once('error', reject);
  }));
  await Promise.all(workers.map((w) => new Promise((resolve, reject) => {
    w.once('message', resolve);
    w.once('error', reject);
    w.once('exit', (code) => reject(new Error(`worker exited (${code}) before it was ready`)));
  })));
  Atomics.store(new Int32Array(go), 0, 1);
  Atomics.notify(new Int32Array(go), 0);
  const rs = await Promise.all(results);
  await Promise.all(exits);
  for (const h of handles) gov.reclaim(h);
  return { perSec: rs.reduce((s, r) => s + r.perSec, 0), refused: rs.reduce((s, r) => s + r.refused, 0) };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const fmt = (n) => Math.round(n).toLocaleString('en-US');

async function main() {
  const loadStart = loadavg()[0];
  const rows = { memory: [], shared: [], shared1: [], shared2same: [], shared2own: [], hMemory: [], hShared1: [], hShared2: [] };
  for (let round = 0; round < ROUNDS; round++) {
    const mem = new MemoryGovernor();
    mem.configure([limits(1), limits(2, HANDOFF_SLOTS)], []);
    const sh = new SharedMemoryGovernor();
    sh.configure([limits(1), limits(2), limits(3, HANDOFF_SLOTS)], []);
    rows.memory.push(syncPairs(mem, 1, { count: PAIRS }));
    rows.shared.push(syncPairs(sh, 1, { count: PAIRS }));
    rows.shared1.push((await inWorkers(sh, 1, 'sync', () => 1)).perSec);
    rows.shared2same.push((await inWorkers(sh, 2, 'sync', () => 1)).perSec);
    rows.shared2own.push((await inWorkers(sh, 2, 'sync', (i) => 1 + i)).perSec);
    rows.hMemory.push((await handoffs(mem, 2, 64, SECONDS * 1000)).perSec);
    rows.hShared1.push((await inWorkers(sh, 1, 'handoff', () => 3, { loops: 64 })).perSec);
    rows.hShared2.push((await inWorkers(sh, 2, 'handoff', () => 3, { loops: 32 })).perSec);
    for (const id of [1, 2, 3]) {
      const s = sh.state(id);
      if (s.inFlight !== 0 || s.queued !== 0) throw new Error(`pool ${id} not drained: ${JSON.stringify(s)}`);
    }
    await mem.close();
    await sh.close();
    console.log(`round ${round + 1}:`, Object.fromEntries(Object.entries(rows).map(([k, v]) => [k, fmt(v.at(-1))])));
  }
  const m = Object.fromEntries(Object.entries(rows).map(([k, v]) => [k, median(v)]));
  const loadEnd = loadavg()[0];
  const mach = machine();
  const x = (a, b) => `${(a / b).toFixed(2)}×`;
  const body = `Load average (1 min) ${loadStart.toFixed(2)} at the start, ${loadEnd.toFixed(2)} at the end.
\`npm run bench:governor-shared\` (bench/governor-shared.mjs): acquire + release pairs of the shared-memory governor
(\`src/governor/shared-memory.ts\`, state in one SharedArrayBuffer, one short lock per step) beside the memory governor,
${ROUNDS} rounds in turn, medians; timed phases ${SECONDS} s each. Worker phases run in worker_threads attached to the
main thread's governor.

| What | Pairs per second | |
|---|---:|---|
| Memory governor, one thread, synchronous pairs | ${fmt(m.memory)} | 1 |
| Shared-memory governor, main thread, synchronous pairs | ${fmt(m.shared)} | ${x(m.shared, m.memory)} the memory governor |
| Shared, 1 worker thread, synchronous pairs | ${fmt(m.shared1)} | 1 |
| Shared, 2 worker threads on one pool (sum) | ${fmt(m.shared2same)} | ${x(m.shared2same, m.shared1)} one thread |
| Shared, 2 worker threads, one pool each (sum) | ${fmt(m.shared2own)} | ${x(m.shared2own, m.shared1)} one thread |
| Hand-overs, memory: 4 slots, 64 waiting loops in one thread | ${fmt(m.hMemory)} | 1 |
| Hand-overs, shared: 4 slots, 64 waiting loops in 1 worker | ${fmt(m.hShared1)} | ${x(m.hShared1, m.hMemory)} memory |
| Hand-overs, shared: 4 slots, 32 waiting loops in each of 2 workers | ${fmt(m.hShared2)} | ${x(m.hShared2, m.hMemory)} memory |

Rounds: ${Object.entries(rows).map(([k, v]) => `${k} ${v.map(fmt).join(' / ')}`).join('; ')}.
A hand-over loop acquires with a wait, yields once holding the slot, and releases: past the first four, every
admission is a release handing its slot to the oldest waiter, which with two workers may wait in the other thread
(an Atomics.notify heard through Atomics.waitAsync, one event-loop turn there). After each round every pool is back
to 0 in flight and 0 queued. The two-thread rows do nothing but take and give slots, so they show what the one lock
costs when both threads contend for it at every step (its cache line moves between cores), not how a data plane
scales: a proxied request spends ~100 µs of CPU elsewhere for each pair. On a shared machine two threads seldom run at
once, and these rows read higher.
`;
  writeResults('governor-shared', 'Governor: shared memory across threads', body, { command: benchCommand('npm run bench:governor-shared', ['ROUNDS']), m: mach });
  const json = writeJson('governor-shared.json', { machine: mach, loadStart, loadEnd, seconds: SECONDS, rounds: rows, medians: m });
  console.log(body);
  console.log(`raw: ${json}`);
}

if (!isMainThread) {
  const { handle, mode, poolId, go, ms, loops } = workerData;
  const gov = SharedMemoryGovernor.attach(handle);
  parentPort.postMessage({ ready: true });
  // Start together: the main thread flips `go` once every worker is ready.
  const flag = new Int32Array(go);
  while (Atomics.load(flag, 0) === 0) Atomics.wait(flag, 0, 0, 50);
  const result = mode === 'sync' ? { perSec: syncPairs(gov, poolId, { ms }), refused: 0 } : await handoffs(gov, poolId, loops, ms);
  await gov.close();
  parentPort.postMessage(result);
} else {
  await main();
}
