// bench:governor — acquire+release pairs per second: the memory governor (synchronous, one node), the Redis
// governor (many concurrent pairs, auto-pipelined), and the ceiling of the same Lua work measured with
// redis-benchmark (EVALSHA of the acquire and release scripts) on the same private redis-server, in one run.
// The machine is shared, so the Redis governor and the ceiling are measured in alternating rounds and each
// round's ratio is taken side by side; the table shows the medians.
// Run: npm run bench:governor   (env BENCH_SECONDS per governor phase, default 4; ROUNDS, default 3; CONCURRENCY, default 256)
import { execFileSync, spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { loadavg } from 'node:os';
import { Redis } from 'ioredis';
import { MemoryGovernor } from '../src/governor/memory.ts';
import { RedisGovernor } from '../src/governor/redis.ts';
import { ACQUIRE, RELEASE } from '../src/governor/redis-scripts.ts';
import { machine, writeJson, writeSection } from './lib/results.mjs';

const SECONDS = Number(process.env.BENCH_SECONDS ?? 4);
const ROUNDS = Number(process.env.ROUNDS ?? 3);
const BENCHMARK_REQUESTS = 250_000;
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 256);
const MEMORY_PAIRS = 2_000_000;
const limits = (poolId) => ({ poolId, maxConcurrent: 1_000_000, queueLength: 0, queueTimeoutMs: 0, budgetId: null, reservedConcurrent: 0 });

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.once('error', reject);
  });
}

async function startRedis(port) {
  const proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  for (let i = 0; i < 100; i++) {
    const probe = new Redis({ port, lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 });
    probe.on('error', () => {});
    try {
      await probe.connect();
      await probe.ping();
      probe.disconnect();
      return proc;
    } catch {
      probe.disconnect();
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  proc.kill('SIGKILL');
  throw new Error('redis-server did not start');
}

function memoryPairs() {
  const gov = new MemoryGovernor();
  gov.configure([limits(1)], []);
  for (let i = 0; i < 100_000; i++) gov.acquire({ poolId: 1, waitMs: 0 }).permit.release(); // warm-up
  const start = performance.now();
  for (let i = 0; i < MEMORY_PAIRS; i++) {
    const a = gov.acquire({ poolId: 1, waitMs: 0 });
    if (a instanceof Promise || !a.ok) throw new Error('expected a free slot');
    a.permit.release();
  }
  const s = (performance.now() - start) / 1000;
  void gov.close();
  return MEMORY_PAIRS / s;
}

/** CONCURRENCY loops of acquire (one script) then release (one script), through one auto-pipelined connection. */
async function redisPairs(port) {
  const gov = new RedisGovernor({ url: `redis://127.0.0.1:${port}`, prefix: 'bench:' });
  await gov.ready();
  gov.configure([limits(1)], []);
  let pairs = 0;
  let refused = 0;
  const run = async (ms, count) => {
    const until = performance.now() + ms;
    const loop = async () => {
      while (performance.now() < until) {
        const a = await gov.acquire({ poolId: 1, waitMs: 0 });
        if (!a.ok) {
          refused++;
          continue;
        }
        a.permit.release();
        if (count) pairs++;
      }
    };
    await Promise.all(Array.from({ length: CONCURRENCY }, loop));
    await gov.redis.ping(); // every release sent before this has been answered
  };
  await run(1000, false); // warm-up
  const start = performance.now();
  await run(SECONDS * 1000, true);
  const s = (performance.now() - start) / 1000;
  const left = await gov.redis.zcard('bench:{p:1}:1:slots');
  await gov.close();
  return { pairsPerSec: pairs / s, refused, leasesLeft: left };
}

/** The same two EVALSHA calls per pair straight through ioredis (no governor): what the client library costs. */
async function rawPairs(port) {
  const r = new Redis({ port, enableAutoPipelining: true });
  const k = 'raw:{p:1}:1:';
  let pairs = 0;
  let seq = 0;
  const run = async (ms, count) => {
    const until = performance.now() + ms;
    const loop = async () => {
      while (performance.now() < until) {
        const id = `raw:${++seq}`;
        await r.evalsha(ACQUIRE.sha, 6, `${k}slots`, `${k}eff`, `${k}line`, `${k}line-exp`, `${k}rate`, `${k}pause`, id, '30000', '1000000', 'node', '0', '500', '0');
        void r.evalsha(RELEASE.sha, 2, `${k}slots`, `${k}line`, id, 'bench:freed', '{p:1}', '0');
        if (count) pairs++;
      }
    };
    await Promise.all(Array.from({ length: CONCURRENCY }, loop));
    await r.ping();
  };
  await run(500, false);
  const start = performance.now();
  await run(SECONDS * 1000, true);
  const s = (performance.now() - start) / 1000;
  await r.del(`${k}slots`);
  r.disconnect();
  return pairs / s;
}

/** redis-benchmark's requests per second for one EVALSHA command line (pipelined, 50 clients). */
function benchmark(port, args) {
  const out = execFileSync(
    'redis-benchmark',
    ['-h', '127.0.0.1', '-p', String(port), '-c', '50', '-P', '16', '-r', '100000000', '-n', String(BENCHMARK_REQUESTS), '-q', ...args],
    { encoding: 'utf8', timeout: 120_000 },
  );
  const m = /([\d.]+) requests per second/.exec(out);
  if (!m) throw new Error(`unexpected redis-benchmark output: ${out}`);
  return Number(m[1]);
}

async function main() {
  const m = machine();
  const port = await freePort();
  const proc = await startRedis(port);
  try {
    const admin = new Redis({ port });
    await admin.script('LOAD', ACQUIRE.source);
    await admin.script('LOAD', RELEASE.source);

    const memory = memoryPairs();
    // The same keys and arguments the governor sends; a random lease id per call (__rand_int__).
    const k = 'ceiling:{p:1}:1:';
    const rounds = [];
    for (let r = 0; r < ROUNDS; r++) {
      const gov = await redisPairs(port);
      const raw = await rawPairs(port);
      const acquireOps = benchmark(port, ['EVALSHA', ACQUIRE.sha, '6', `${k}slots`, `${k}eff`, `${k}line`, `${k}line-exp`, `${k}rate`, `${k}pause`, 'lease:__rand_int__', '30000', '1000000000', 'node', '0', '500', '0']);
      // The release script on random ids from the same range (most are not members: a ZREM that finds
      // nothing, slightly cheaper than the governor's, which always finds its lease).
      const releaseOps = benchmark(port, ['EVALSHA', RELEASE.sha, '2', `${k}slots`, `${k}line`, 'lease:__rand_int__', 'bench:freed', '{p:1}', '0']);
      await admin.del(`${k}slots`);
      // One pair is one acquire and one release: the pair ceiling is the harmonic combination.
      const ceiling = 1 / (1 / acquireOps + 1 / releaseOps);
      rounds.push({ governor: gov, rawIoredisPairsPerSec: raw, acquireOps, releaseOps, ceiling, ratio: gov.pairsPerSec / ceiling });
      console.error(`round ${r + 1}: governor ${Math.round(gov.pairsPerSec)}, bare ioredis ${Math.round(raw)}, ceiling ${Math.round(ceiling)} pairs/s: ${(100 * gov.pairsPerSec / ceiling).toFixed(0)}%`);
    }
    await admin.del('bench:{p:1}:1:slots');
    admin.disconnect();
    const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    const redis = {
      pairsPerSec: median(rounds.map((x) => x.governor.pairsPerSec)),
      refused: rounds.reduce((s, x) => s + x.governor.refused, 0),
      leasesLeft: rounds.reduce((s, x) => s + x.governor.leasesLeft, 0),
    };
    const rawOps = median(rounds.map((x) => x.rawIoredisPairsPerSec));
    const acquireOps = median(rounds.map((x) => x.acquireOps));
    const releaseOps = median(rounds.map((x) => x.releaseOps));
    const ceiling = median(rounds.map((x) => x.ceiling));
    const ratio = median(rounds.map((x) => x.ratio));
    const loadAfter = Math.round(loadavg()[0] * 100) / 100;
    const loadEnd = Math.round(m.loadavg_1m * 100) / 100;
    const report = {
      date: new Date().toISOString(),
      machine: m,
      settings: { seconds: SECONDS, rounds: ROUNDS, concurrency: CONCURRENCY, memoryPairs: MEMORY_PAIRS, redisBenchmark: { clients: 50, pipeline: 16, requests: BENCHMARK_REQUESTS } },
      loadavgAfter: loadAfter,
      memoryPairsPerSec: memory,
      redisGovernor: redis,
      rawIoredisPairsPerSec: rawOps,
      ceiling: { acquireEvalshaPerSec: acquireOps, releaseEvalshaPerSec: releaseOps, pairsPerSec: ceiling },
      ratioToCeiling: ratio,
      rounds,
    };
    const stamp = report.date.replace(/[:.]/g, '-');
    writeJson(`governor-${stamp}.json`, report);
    writeJson('governor-latest.json', report);
    const f = (n) => Math.round(n).toLocaleString('en-US');
    writeSection(
      '## Governor',
      `${report.date.slice(0, 16).replace('T', ' ')} UTC, ${m.nproc} CPUs (${m.cpu}), Node ${m.node}, load average (1 min) ${loadEnd} at the start, ${loadAfter} at the end.
Redis ${execFileSync('redis-server', ['--version'], { encoding: 'utf8' }).match(/v=([\d.]+)/)?.[1] ?? '?'}: a private \`redis-server\` started by the benchmark (no persistence), on the same machine.
\`npm run bench:governor\`; one acquire + release pair = two script calls on the Redis governor.

| What | Pairs per second | |
|---|---:|---|
| Memory governor (synchronous, one node) | ${f(memory)} | |
| Redis governor, ${CONCURRENCY} concurrent pairs, one auto-pipelined connection (median of ${ROUNDS} rounds) | ${f(redis.pairsPerSec)} | |
| The same two EVALSHA calls straight through ioredis, no governor (median) | ${f(rawOps)} | the client library's own cost |
| Ceiling: redis-benchmark EVALSHA acquire ${f(acquireOps)}/s and release ${f(releaseOps)}/s (50 clients, pipeline 16; medians) | ${f(ceiling)} | = 1 / (1/acquire + 1/release) |

Rounds (governor ${SECONDS} s, bare ioredis ${SECONDS} s, then the ceiling): governor / bare ioredis / ceiling = ${rounds.map((x) => `${f(x.governor.pairsPerSec)} / ${f(x.rawIoredisPairsPerSec)} / ${f(x.ceiling)} (${(x.ratio * 100).toFixed(0)}%)`).join('; ')}.
The Redis governor reaches a median ${(ratio * 100).toFixed(0)}% of what Redis itself can run of the same Lua work (target ≥ 50%);
the governor runs at ${(100 * redis.pairsPerSec / rawOps).toFixed(0)}% of bare ioredis making the same two calls, so the gap to the ceiling is the
Node.js client (ioredis command encoding and garbage collection) against redis-benchmark's C client, on a CPU-starved machine.
The memory governor is ${f(memory / redis.pairsPerSec)}× faster than the Redis governor on one node, the price of sharing the limit.
Refused acquires during the run: ${redis.refused}; leases left after it: ${redis.leasesLeft}. On 2 shared cores
the governor's process and redis-server compete for CPU, so both figures are lower bounds.`,
    );
    console.log(JSON.stringify(report, null, 2));
  } finally {
    proc.kill('SIGKILL');
  }
}

await main();
