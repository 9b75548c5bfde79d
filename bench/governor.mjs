// bench:governor — acquire+release pairs per second: the memory governor (synchronous, one node), the Redis
// governor (many concurrent pairs; one script call per pool per event-loop turn for its acquires, one for its
// releases), and the ceiling of the same Lua work measured with redis-benchmark (EVALSHA, one caller per
// call, as the governor sends it when uncontended) on the same private redis-server, in one run. Also what
// redis-benchmark gets from the batched calls at the governor's own mean batch size, so both comparisons show.
// The machine is shared, so everything Redis-side is measured in alternating rounds and each round's ratio is
// taken side by side; the table shows the medians. With PROFILE=1 a CPU profile of each governor run is
// summarised (node:inspector, same process).
// With BASELINE_ROOT=<a checkout of an earlier commit, with node_modules> the earlier Redis governor runs in
// the same rounds (before / after side by side).
// Run: npm run bench:governor   (env BENCH_SECONDS per governor phase, default 4; ROUNDS, default 3; CONCURRENCY, default 256;
// -- --write-results rewrites the bench:governor section of bench/RESULTS.md)
import { execFileSync, spawn } from 'node:child_process';
import { Session } from 'node:inspector/promises';
import { freePort } from './lib/child.mjs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Redis } from 'ioredis';
import { MemoryGovernor } from '../src/governor/memory.ts';
import { RedisGovernor } from '../src/governor/redis.ts';
import { ACQUIRE, RELEASE } from '../src/governor/redis-scripts.ts';
import { benchCommand, machine, writeJson, writeResults } from './lib/results.mjs';

const SECONDS = Number(process.env.BENCH_SECONDS ?? 4);
const ROUNDS = Number(process.env.ROUNDS ?? 3);
const BENCHMARK_REQUESTS = 250_000;
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 256);
const PROFILE = process.env.PROFILE === '1';
const BASELINE_ROOT = process.env.BASELINE_ROOT ?? null;
const MEMORY_PAIRS = 2_000_000;
const limits = (poolId) => ({ poolId, maxConcurrent: 1_000_000, queueLength: 0, queueTimeoutMs: 0, budgetId: null, reservedConcurrent: 0 });
const Baseline = BASELINE_ROOT ? (await import(pathToFileURL(join(BASELINE_ROOT, 'src/governor/redis.ts')).href)).RedisGovernor : null;
const baselineCommit = BASELINE_ROOT ? (process.env.BASELINE_COMMIT ?? BASELINE_ROOT) : null;

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

/** EVALSHA calls Redis ran since the last reset (INFO commandstats). */
async function evalshaCalls(admin) {
  const m = /cmdstat_evalsha:calls=(\d+)/.exec(await admin.info('commandstats'));
  return m ? Number(m[1]) : 0;
}

/** Self time of a CPU profile by where it was spent, and the heaviest functions. */
function summarize(profile) {
  const self = new Map();
  for (let i = 0; i < profile.samples.length; i++) self.set(profile.samples[i], (self.get(profile.samples[i]) ?? 0) + (profile.timeDeltas[i] ?? 0));
  const total = profile.endTime - profile.startTime;
  const groups = { idle: 0, gc: 0, ioredis: 0, governor: 0, other: 0 };
  const fns = new Map();
  for (const n of profile.nodes) {
    const t = self.get(n.id) ?? 0;
    if (t === 0) continue;
    const { functionName, url, lineNumber } = n.callFrame;
    const group =
      functionName === '(idle)' ? 'idle' : functionName === '(garbage collector)' ? 'gc' : url.includes('/ioredis/') ? 'ioredis' : url.includes('/src/governor/') ? 'governor' : 'other';
    groups[group] += t;
    const where = url ? `${url.replace(/^.*\/(node_modules\/|src\/)/, '')}:${lineNumber + 1}` : '';
    const key = `${functionName || '(anonymous)'}${where ? ` ${where}` : ''}`;
    fns.set(key, (fns.get(key) ?? 0) + t);
  }
  const pct = (t) => Math.round((1000 * t) / total) / 10;
  return {
    share: Object.fromEntries(Object.entries(groups).map(([k, v]) => [k, pct(v)])),
    top: [...fns].sort((a, b) => b[1] - a[1]).slice(0, 8).map(([fn, t]) => ({ fn, pct: pct(t) })),
  };
}

/**
 * CONCURRENCY loops of acquire then release through one governor (one connection). Counts the EVALSHA calls
 * Redis ran, so the mean number of callers per script call is known.
 */
async function redisPairs(Gov, port, admin, prefix) {
  const gov = new Gov({ url: `redis://127.0.0.1:${port}`, prefix });
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
  await admin.config('RESETSTAT');
  let session = null;
  if (PROFILE) {
    session = new Session();
    session.connect();
    await session.post('Profiler.enable');
    await session.post('Profiler.start');
  }
  const start = performance.now();
  await run(SECONDS * 1000, true);
  const s = (performance.now() - start) / 1000;
  let profile = null;
  if (session) {
    profile = summarize((await session.post('Profiler.stop')).profile);
    session.disconnect();
  }
  const calls = await evalshaCalls(admin);
  const left = await gov.redis.zcard(`${prefix}{p:1}:1:slots`);
  await gov.close();
  return { pairsPerSec: pairs / s, refused, leasesLeft: left, callersPerCall: (2 * pairs) / Math.max(1, calls), profile };
}

/** The same two EVALSHA calls per pair, one caller each, straight through ioredis (no governor): the client library's cost unbatched. */
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
        await r.evalsha(ACQUIRE.sha, 6, `${k}slots`, `${k}eff`, `${k}line`, `${k}line-exp`, `${k}rate`, `${k}pause`, 'node', '500', '1000000', '1', id, '30000', '0', '0');
        void r.evalsha(RELEASE.sha, 2, `${k}slots`, `${k}line`, 'bench:freed', '{p:1}', '0', id);
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

/** redis-benchmark's calls per second for one EVALSHA command line (pipelined, 50 clients). */
function benchmark(port, args, requests = BENCHMARK_REQUESTS) {
  const out = execFileSync(
    'redis-benchmark',
    ['-h', '127.0.0.1', '-p', String(port), '-c', '50', '-P', '16', '-r', '100000000', '-n', String(requests), '-q', ...args],
    // -q still prints progress lines that repeat the command line (long for a batch of 128 callers).
    { encoding: 'utf8', timeout: 120_000, maxBuffer: 512 * 1024 * 1024 },
  );
  const m = /([\d.]+) requests per second/.exec(out);
  if (!m) throw new Error(`unexpected redis-benchmark output: ${out}`);
  return Number(m[1]);
}

const KEYS = (k) => [`${k}slots`, `${k}eff`, `${k}line`, `${k}line-exp`, `${k}rate`, `${k}pause`];

/**
 * Acquire and release script calls with `n` callers each, as the governor sends them (a random lease id per
 * caller: __rand_int__); returns callers per second (calls × n) for each, and the pair figure.
 */
function scriptCeiling(port, n) {
  const k = 'ceiling:{p:1}:1:';
  const acquireArgs = ['EVALSHA', ACQUIRE.sha, '6', ...KEYS(k), 'node', '500', '1000000000', String(n)];
  for (let i = 0; i < n; i++) acquireArgs.push('lease:__rand_int__', '30000', '0', '0');
  // Releases of random ids from the same range (most are not members: a ZREM that finds nothing, slightly
  // cheaper than the governor's, which always finds its lease).
  const releaseArgs = ['EVALSHA', RELEASE.sha, '2', `${k}slots`, `${k}line`, 'bench:freed', '{p:1}', '0'];
  for (let i = 0; i < n; i++) releaseArgs.push('lease:__rand_int__');
  const requests = Math.max(10_000, Math.round(BENCHMARK_REQUESTS / n));
  const acquire = benchmark(port, acquireArgs, requests) * n;
  const release = benchmark(port, releaseArgs, requests) * n;
  // One pair is one acquire and one release: the pair ceiling is the harmonic combination.
  return { acquire, release, pairs: 1 / (1 / acquire + 1 / release) };
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
    const rounds = [];
    for (let r = 0; r < ROUNDS; r++) {
      const gov = await redisPairs(RedisGovernor, port, admin, 'bench:');
      const before = Baseline ? await redisPairs(Baseline, port, admin, 'base:') : null;
      const raw = await rawPairs(port);
      const single = scriptCeiling(port, 1);
      const batch = Math.max(1, Math.round(gov.callersPerCall));
      const batched = scriptCeiling(port, batch);
      await admin.del('ceiling:{p:1}:1:slots');
      rounds.push({ governor: gov, baseline: before, rawIoredisPairsPerSec: raw, ceiling: single, batchedCeiling: { callersPerCall: batch, ...batched }, ratio: gov.pairsPerSec / single.pairs });
      console.error(
        `round ${r + 1}: governor ${Math.round(gov.pairsPerSec)} (${gov.callersPerCall.toFixed(1)} callers/call)${before ? `, before ${Math.round(before.pairsPerSec)}` : ''}, bare ioredis ${Math.round(raw)}, ceiling ${Math.round(single.pairs)} pairs/s: ${(100 * gov.pairsPerSec / single.pairs).toFixed(0)}%; batched ceiling (${batch}/call) ${Math.round(batched.pairs)}`,
      );
    }
    await admin.del('bench:{p:1}:1:slots', 'base:{p:1}:1:slots');
    admin.disconnect();
    const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    const redis = {
      pairsPerSec: median(rounds.map((x) => x.governor.pairsPerSec)),
      callersPerCall: median(rounds.map((x) => x.governor.callersPerCall)),
      refused: rounds.reduce((s, x) => s + x.governor.refused, 0),
      leasesLeft: rounds.reduce((s, x) => s + x.governor.leasesLeft, 0),
    };
    const base = Baseline
      ? {
          pairsPerSec: median(rounds.map((x) => x.baseline.pairsPerSec)),
          callersPerCall: median(rounds.map((x) => x.baseline.callersPerCall)),
          refused: rounds.reduce((s, x) => s + x.baseline.refused, 0),
          leasesLeft: rounds.reduce((s, x) => s + x.baseline.leasesLeft, 0),
        }
      : null;
    const rawOps = median(rounds.map((x) => x.rawIoredisPairsPerSec));
    const acquireOps = median(rounds.map((x) => x.ceiling.acquire));
    const releaseOps = median(rounds.map((x) => x.ceiling.release));
    const ceiling = median(rounds.map((x) => x.ceiling.pairs));
    const batchedPairs = median(rounds.map((x) => x.batchedCeiling.pairs));
    const batchSize = median(rounds.map((x) => x.batchedCeiling.callersPerCall));
    const ratio = median(rounds.map((x) => x.ratio));
    const batchedRatio = median(rounds.map((x) => x.governor.pairsPerSec / x.batchedCeiling.pairs));
    const loadAfter = Math.round(loadavg()[0] * 100) / 100;
    const loadEnd = Math.round(m.loadavg_1m * 100) / 100;
    const report = {
      date: new Date().toISOString(),
      machine: m,
      settings: { seconds: SECONDS, rounds: ROUNDS, concurrency: CONCURRENCY, memoryPairs: MEMORY_PAIRS, redisBenchmark: { clients: 50, pipeline: 16, requests: BENCHMARK_REQUESTS }, baseline: baselineCommit },
      loadavgAfter: loadAfter,
      memoryPairsPerSec: memory,
      redisGovernor: redis,
      baselineRedisGovernor: base,
      rawIoredisPairsPerSec: rawOps,
      ceiling: { acquireEvalshaPerSec: acquireOps, releaseEvalshaPerSec: releaseOps, pairsPerSec: ceiling },
      batchedCeiling: { callersPerCall: batchSize, pairsPerSec: batchedPairs },
      ratioToCeiling: ratio,
      ratioToBatchedCeiling: batchedRatio,
      rounds,
    };
    const stamp = report.date.replace(/[:.]/g, '-');
    writeJson(`governor-${stamp}.json`, report);
    writeJson('governor-latest.json', report);
    const f = (n) => Math.round(n).toLocaleString('en-US');
    const pc = (x) => `${(x * 100).toFixed(0)}%`;
    const profileRows = PROFILE
      ? [
          ['Redis governor', rounds.map((x) => x.governor.profile)],
          ...(Baseline ? [[`Before (${baselineCommit})`, rounds.map((x) => x.baseline.profile)]] : []),
        ]
      : [];
    const profileText = PROFILE
      ? `
CPU profile of the benchmark process during each governor run (node:inspector, ${SECONDS} s, round 1; share of wall time):

| Governor | idle (waiting for Redis) | garbage collector | ioredis | src/governor | other (Node, the driving loop) |
|---|---:|---:|---:|---:|---:|
${profileRows.map(([name, ps]) => `| ${name} | ${ps[0].share.idle}% | ${ps[0].share.gc}% | ${ps[0].share.ioredis}% | ${ps[0].share.governor}% | ${ps[0].share.other}% |`).join('\n')}

Heaviest functions (self time, round 1): ${profileRows.map(([name, ps]) => `${name}: ${ps[0].top.map((x) => `${x.fn} ${x.pct}%`).join(', ')}`).join('. ')}.
`
      : '';
    writeResults(
      'governor',
      'Governor: memory and Redis',
      `Load average (1 min) ${loadEnd} at the start, ${loadAfter} at the end.
Redis ${execFileSync('redis-server', ['--version'], { encoding: 'utf8' }).match(/v=([\d.]+)/)?.[1] ?? '?'}: a private \`redis-server\` started by the benchmark (no persistence), on the same machine.
\`npm run bench:governor\`${Baseline ? ` with \`BASELINE_ROOT\` (the governor of ${baselineCommit})` : ''}${PROFILE ? ' and `PROFILE=1`' : ''}; one pair = one acquire and one release. The Redis governor
sends one ACQUIRE script call per pool per event-loop turn for all of that turn's acquires, and one RELEASE call for its releases.

| What | Pairs per second | |
|---|---:|---|
| Memory governor (synchronous, one node) | ${f(memory)} | |
| Redis governor, ${CONCURRENCY} concurrent pairs, one connection (median of ${ROUNDS} rounds) | ${f(redis.pairsPerSec)} | ${redis.callersPerCall.toFixed(1)} callers per script call (median) |
${base ? `| Before: the governor of ${baselineCommit}, one script call per acquire and per release, auto-pipelined (median) | ${f(base.pairsPerSec)} | same rounds |\n` : ''}| Two EVALSHA calls per pair, one caller each, straight through ioredis, no governor (median) | ${f(rawOps)} | the client library's cost unbatched |
| **Ceiling**: redis-benchmark EVALSHA, one caller per call: acquire ${f(acquireOps)}/s, release ${f(releaseOps)}/s (50 clients, pipeline 16; medians) | ${f(ceiling)} | = 1 / (1/acquire + 1/release) |
| redis-benchmark of the same calls with ${f(batchSize)} callers each (the governor's batch size), per caller | ${f(batchedPairs)} | what Redis can do when batched |

Rounds (governor${Baseline ? ', before' : ''}, bare ioredis, ceiling, batched ceiling): ${rounds.map((x) => `${f(x.governor.pairsPerSec)}${x.baseline ? ` / ${f(x.baseline.pairsPerSec)}` : ''} / ${f(x.rawIoredisPairsPerSec)} / ${f(x.ceiling.pairs)} / ${f(x.batchedCeiling.pairs)} (${pc(x.ratio)})`).join('; ')}.
The Redis governor reaches a median **${pc(ratio)}** of the ceiling (target ≥ 50%): one caller's Lua work per call, as the
uncontended path sends it. Against Redis running the batched calls at the governor's own batch size it reaches ${pc(batchedRatio)}.${base ? ` It runs ${(redis.pairsPerSec / base.pairsPerSec).toFixed(1)}× the pairs/s of the governor before batching (${pc(base.pairsPerSec / ceiling)} of the ceiling in these rounds).` : ''}
The memory governor is ${f(memory / redis.pairsPerSec)}× faster than the Redis governor on one node, the price of sharing the limit.
Refused acquires during the run: ${redis.refused}; leases left after it: ${redis.leasesLeft}. On 2 shared cores
the governor's process and redis-server compete for CPU, so all figures are lower bounds.
${profileText}`,
      { command: benchCommand('npm run bench:governor', ['ROUNDS', 'CONCURRENCY', 'PROFILE', 'BASELINE_ROOT']), m, date: report.date },
    );
    console.log(JSON.stringify(report, null, 2));
  } finally {
    proc.kill('SIGKILL');
  }
}

await main();
