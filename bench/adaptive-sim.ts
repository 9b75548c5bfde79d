// Adaptive concurrency and RPM learning: the simulated convergence curves (ASCII charts) and the cost of
// learning on the governor's release path; with --write-results, the bench:adaptive section of bench/RESULTS.md.
// Run: npx tsx bench/adaptive-sim.ts [--write-results]   (env N = acquire/release pairs per micro round, default 2,000,000)
import { loadavg } from 'node:os';
import { MemoryGovernor } from '../src/governor/memory.js';
import type { Outcome, PoolLimits } from '../src/governor/governor.js';
import { simulate, summarize, type SimResult, type UpstreamModel } from '../test/helpers/adaptive-sim.js';
// @ts-expect-error plain ESM helper without types
import { benchCommand, machine, writeJson, writeResults } from './lib/results.mjs';

const N = Number(process.env.N ?? 2_000_000);

/**
 * An ASCII chart of series over time: one column per bucket (its mean), `marks` drawn in order (later
 * ones on top); values above `top` are drawn as ^ on the top row.
 */
function chart(points: number[][], marks: string[], labels: string[], top: number, height = 16, width = 75): string {
  const cols = Math.min(width, points[0]!.length);
  const per = points[0]!.length / cols;
  const bucket = (s: number[], c: number) => {
    const from = Math.floor(c * per);
    const to = Math.max(from + 1, Math.floor((c + 1) * per));
    const xs = s.slice(from, to).filter((v) => Number.isFinite(v));
    return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN;
  };
  const series = points.map((s) => Array.from({ length: cols }, (_, c) => bucket(s, c)));
  const grid = Array.from({ length: height }, () => Array.from({ length: cols }, () => ' '));
  series.forEach((s, i) =>
    s.forEach((v, c) => {
      if (!Number.isFinite(v)) return;
      if (v > top) grid[0]![c] = '^';
      else grid[height - 1 - Math.min(height - 1, Math.floor((v / top) * height))]![c] = marks[i]!;
    }),
  );
  const axis = (r: number) => String(Math.round((top * (height - r)) / height)).padStart(6);
  const lines = grid.map((row, r) => `${r % 4 === 0 ? axis(r) : '      '} |${row.join('')}`);
  lines.push(`       +${'-'.repeat(cols)}`);
  lines.push(`        0 s${' '.repeat(Math.max(1, cols - 8))}${points[0]!.length} s`);
  lines.push(`        ${labels.map((l, i) => `${marks[i]} ${l}`).join('   ')}   ^ above the top`);
  return lines.join('\n');
}

interface Scenario {
  name: string;
  upstream: UpstreamModel;
  clients: number;
  maxConcurrent: number;
  seed: number;
}

const DURATION_MS = 300_000;
const WARM_UP_MS = 60_000;

const scenarios: Scenario[] = [
  { name: 'concurrency-bound: C = 40, 100 ms, 429 past 60, states 30,000/min', upstream: { capacity: 40, hardLimit: 60, baseMs: 100, jitter: 0.2, rpm: 30_000 }, clients: 200, maxConcurrent: 200, seed: 7 },
  { name: 'rate-bound: R = 6,000/min (C = 40 could do 24,000/min)', upstream: { capacity: 40, hardLimit: 60, baseMs: 100, jitter: 0.2, rpm: 6000 }, clients: 200, maxConcurrent: 200, seed: 11 },
  {
    name: 'capacity drop: C = 80 → 40 at 150 s',
    upstream: { capacity: 80, hardLimit: 120, baseMs: 100, jitter: 0.2, rpm: Infinity, change: { atMs: 150_000, capacity: 40 } },
    clients: 300,
    maxConcurrent: 300,
    seed: 3,
  },
];

/** Upstream answers per minute, over the trailing 60 s of the curve (1 s points). */
function perMinute(r: SimResult): number[] {
  return r.curve.map((_, i) => r.curve.slice(Math.max(0, i - 59), i + 1).reduce((s, p) => s + p.ok, 0) * (60 / Math.min(60, i + 1)));
}

/** acquire+release pairs per second with a given outcome on release. */
function pairs(limits: PoolLimits, outcome: Outcome | undefined): number {
  const gov = new MemoryGovernor();
  gov.configure([limits], []);
  const start = process.hrtime.bigint();
  for (let i = 0; i < N; i++) {
    const a = gov.acquire({ poolId: limits.poolId, waitMs: 0 });
    if (a instanceof Promise || !a.ok) throw new Error('expected a free slot');
    a.permit.release(outcome);
  }
  const s = Number(process.hrtime.bigint() - start) / 1e9;
  void gov.close();
  return N / s;
}

async function main(): Promise<void> {
  const m = machine();
  const results: Array<{ scenario: Scenario; summary: ReturnType<typeof summarize>; ideal: number; result: SimResult; wallMs: number }> = [];
  for (const sc of scenarios) {
    const t0 = performance.now();
    const result = await simulate({ upstream: sc.upstream, clients: sc.clients, durationMs: DURATION_MS, maxConcurrent: sc.maxConcurrent, seed: sc.seed });
    const wallMs = performance.now() - t0;
    const u = sc.upstream;
    const finalCapacity = u.change?.capacity ?? u.capacity;
    const ideal = Math.min((finalCapacity * 1000) / u.baseMs, u.rpm / 60);
    const from = u.change ? u.change.atMs + 30_000 : WARM_UP_MS;
    results.push({ scenario: sc, summary: summarize(result, from), ideal, result, wallMs });
    console.log(sc.name, summarize(result, from), `ideal ${ideal}/s`, `wall ${wallMs.toFixed(0)} ms`);
  }

  // The release path: no outcome vs an outcome feeding the controller vs one with rate headers to parse.
  const base: PoolLimits = { poolId: 1, maxConcurrent: 100, queueLength: 100, queueTimeoutMs: 1000, budgetId: null, reservedConcurrent: 0 };
  const plainHeaders = { 'content-type': 'application/json', 'content-length': '123', date: 'Sun, 22 Nov 2026 12:00:00 GMT', server: 'x', 'x-request-id': 'abc', age: '0' };
  const rateHeaders = { ...plainHeaders, 'x-ratelimit-limit-requests': '1000000000000', 'x-ratelimit-remaining-requests': '999999999999', 'x-ratelimit-reset-requests': '10ms' };
  const cases: Array<[string, PoolLimits, Outcome | undefined]> = [
    ['fixed limit, release() without outcome', base, undefined],
    ['adaptive on, outcome without rate headers', { ...base, adaptive: true }, { status: 200, latencyMs: 12, headers: plainHeaders }],
    ['adaptive on, outcome with x-ratelimit-*-requests', { ...base, adaptive: true }, { status: 200, latencyMs: 12, headers: rateHeaders }],
  ];
  // Rounds interleave the cases, so machine load drifting over the run skews them alike.
  const micro: Array<[string, number]> = cases.map(([label]) => [label, 0]);
  for (let round = 0; round < 2; round++) {
    cases.forEach(([, limits, outcome], i) => {
      micro[i]![1] = Math.max(micro[i]![1], pairs(limits, outcome));
    });
  }
  for (const [label, v] of micro) console.log(`${label}: ${(v / 1e6).toFixed(2)} M pairs/s`);

  const [conc, rate, drop] = results;
  const limitChart = (r: (typeof results)[number], c: number[]) =>
    chart([r.result.curve.map((_, i) => c[i]!), r.result.curve.map((p) => p.limit)], ['-', '*'], ['true capacity C', 'learned limit'], 2 * Math.max(...c));
  const rel = (v: number, ref: number) => `${((v / ref - 1) * 100).toFixed(1)}%`;
  const row = (r: (typeof results)[number]) =>
    `| ${r.scenario.name} | ${r.summary.meanLimit.toFixed(1)} (${r.summary.minLimit}–${r.summary.maxLimit}) | ${r.summary.learnedRpm ?? '—'} | ${(r.summary.throttledShare * 100).toFixed(2)}% | ${r.summary.okPerSecond.toFixed(1)} / ${r.ideal} (${((r.summary.okPerSecond / r.ideal) * 100).toFixed(1)}%) | ${(r.wallMs / 1000).toFixed(1)} s |`;

  const loadEnd = Math.round(loadavg()[0]! * 100) / 100;
  const us = (v: number) => (1e6 / v).toFixed(2);
  const body = `1-minute load average ${loadEnd} at the end (on a shared machine the micro figures are noisy: compare the
ratios). The bench runs the discrete-event
simulation of \`test/helpers/adaptive-sim.ts\`: clients in a closed loop through the real MemoryGovernor
(adaptive on, floor 1) against a simulated upstream whose latency is \`base · max(1, in-flight / C)\`
(±10% jitter), which answers 429 (retry-after 1 s) past a hard in-flight limit, and 429 with
retry-after and \`x-ratelimit-*-requests\` past R requests in its fixed minute window. Simulated time
(${DURATION_MS / 1000} s per scenario), seeded random; figures after a ${WARM_UP_MS / 1000} s warm-up (30 s after the drop in
the third). Ideal = min(C / base latency, R / 60) answers per second.

| scenario | learned limit, mean (range) | learned RPM | upstream 429s | answers/s vs ideal | wall time |
| --- | --- | --- | --- | --- | --- |
${results.map(row).join('\n')}

Concurrency-bound: the limit settles at C plus its queue allowance (√limit / 2 ≈ 3), ${rel(conc!.summary.meanLimit, 40)} over C;
the chart plots the learned limit; the enforced one drops to half of it for about four round trips during the
baseline probe every 30 s (about 1% of the throughput).

\`\`\`
${limitChart(conc!, conc!.result.curve.map(() => 40))}
\`\`\`

Capacity drop (C 80 → 40 at 150 s): the latency gradient brings the limit down within a few seconds.

\`\`\`
${limitChart(drop!, drop!.result.curve.map((p) => (p.tMs < 150_000 ? 80 : 40)))}
\`\`\`

Rate-bound (R = 6,000/min): the concurrency limit is not learned here (about 10 of its slots are in use, and an idle
pool does not grow it). The RPM is learned from the first answer's headers; the gate (3% under R) keeps
the answers per minute (trailing 60 s) just under R with no 429s.

\`\`\`
${chart([rate!.result.curve.map(() => 6000), rate!.result.curve.map((p) => p.learnedRpm ?? NaN), perMinute(rate!.result)], ['-', 'o', '*'], ['true R', 'learned RPM', 'answers per minute'], 8000)}
\`\`\`

Cost on the release path (acquire + release pairs per second, one pool, same process, ${N.toLocaleString('en')} pairs, best of
2 rounds):

| release | M pairs/s | vs fixed |
| --- | --- | --- |
${micro.map(([l, v]) => `| ${l} | ${(v / 1e6).toFixed(2)} | ${(v / micro[0]![1]).toFixed(2)}× |`).join('\n')}

Per pair that is ${us(micro[0]![1])} µs with a fixed limit, ${us(micro[1]![1])} µs when the release feeds the controller and scans the
response's header names, ${us(micro[2]![1])} µs when it also parses stated rate limits: well under the tens of µs a proxied
request costs in the data plane.
`;
  writeResults('adaptive', 'Adaptive concurrency and RPM learning', body, { command: benchCommand('npx tsx bench/adaptive-sim.ts', ['N']), m });
  writeJson('adaptive-latest.json', {
    machine: m,
    scenarios: results.map((r) => ({ name: r.scenario.name, summary: r.summary, ideal: r.ideal, curve: r.result.curve })),
    micro: Object.fromEntries(micro),
  });
}

await main();
