// Simulation: many clients through the MemoryGovernor against an upstream with a true concurrency capacity
// C and a true RPM limit R. Simulated time and a seeded random: deterministic, and a few seconds to run (each run
// in a worker thread, away from tap's promise hooks: simulateApart).
import t from 'tap';
import { simulateApart, summarize, type UpstreamModel } from './helpers/adaptive-sim.js';

const WARM_UP_MS = 60_000;

/** Answers per second an upstream can give: C slots of `baseMs` each, or R per minute if lower. */
const ideal = (u: UpstreamModel) => Math.min((u.capacity * 1000) / u.baseMs, u.rpm / 60);

t.test('concurrency-bound upstream: the limit converges near C, the stated RPM is learned', async (t) => {
  // C = 40 slots of 100 ms (400/s); 429s past 60 in flight; a stated 30,000/min it never reaches.
  const upstream: UpstreamModel = { capacity: 40, hardLimit: 60, baseMs: 100, jitter: 0.2, rpm: 30_000 };
  const r = await simulateApart({ upstream, clients: 200, durationMs: 240_000, maxConcurrent: 200, seed: 7 });
  const s = summarize(r, WARM_UP_MS);
  t.ok(Math.abs(s.meanLimit - 40) <= 8, `mean learned limit ${s.meanLimit.toFixed(1)} within 20% of C = 40`);
  t.ok(s.minLimit >= 32 && s.maxLimit <= 48, `every sampled limit (${s.minLimit}–${s.maxLimit}) within 20% of C`);
  t.ok(Math.abs(s.learnedRpm! - 30_000) <= 6000, `learned RPM ${s.learnedRpm} within 20% of R`);
  t.ok(s.throttledShare < 0.01, `429 share ${(s.throttledShare * 100).toFixed(2)}% < 1%`);
  t.ok(s.okPerSecond > 0.8 * ideal(upstream), `throughput ${s.okPerSecond.toFixed(0)}/s > 80% of ${ideal(upstream)}/s`);
});

t.test('rate-bound upstream: the RPM gate holds admissions just under R without 429s', async (t) => {
  // R = 6,000/min (100/s) while the 40 slots could do 400/s; past R the upstream answers 429 with
  // retry-after and x-ratelimit-*-requests (remaining 0, reset at the end of its minute window).
  const upstream: UpstreamModel = { capacity: 40, hardLimit: 60, baseMs: 100, jitter: 0.2, rpm: 6000 };
  const r = await simulateApart({ upstream, clients: 200, durationMs: 240_000, maxConcurrent: 200, seed: 11 });
  const s = summarize(r, WARM_UP_MS);
  t.ok(Math.abs(s.learnedRpm! - 6000) <= 1200, `learned RPM ${s.learnedRpm} within 20% of R = 6000`);
  t.ok(s.throttledShare < 0.01, `429 share ${(s.throttledShare * 100).toFixed(2)}% < 1%`);
  t.ok(s.okPerSecond > 0.8 * ideal(upstream), `throughput ${s.okPerSecond.toFixed(1)}/s > 80% of ${ideal(upstream)}/s`);
  t.ok(s.okPerSecond <= ideal(upstream), 'and never above R');
});

t.test('the upstream loses half its capacity: the limit follows it down', async (t) => {
  const upstream: UpstreamModel = { capacity: 80, hardLimit: 120, baseMs: 100, jitter: 0.2, rpm: Infinity, change: { atMs: 120_000, capacity: 40 } };
  const r = await simulateApart({ upstream, clients: 300, durationMs: 240_000, maxConcurrent: 300, seed: 3 });
  const before = summarize(r, WARM_UP_MS, 120_000);
  const after = summarize(r, 150_000);
  t.ok(Math.abs(before.meanLimit - 80) <= 16, `before: mean limit ${before.meanLimit.toFixed(1)} within 20% of 80`);
  t.ok(Math.abs(after.meanLimit - 40) <= 8, `30 s after the drop: mean limit ${after.meanLimit.toFixed(1)} within 20% of 40`);
  t.ok(after.throttledShare < 0.01, `429 share ${(after.throttledShare * 100).toFixed(2)}% < 1%`);
  t.ok(after.okPerSecond > 0.8 * 400, `throughput ${after.okPerSecond.toFixed(0)}/s > 80% of 400/s`);
});

t.test('the simulation is deterministic: the same seed gives the same curve', async (t) => {
  const upstream: UpstreamModel = { capacity: 10, hardLimit: 15, baseMs: 50, jitter: 0.3, rpm: 3000 };
  const a = await simulateApart({ upstream, clients: 40, durationMs: 30_000, maxConcurrent: 50, seed: 5 });
  const b = await simulateApart({ upstream, clients: 40, durationMs: 30_000, maxConcurrent: 50, seed: 5 });
  t.same(a.curve, b.curve);
  t.equal(a.upstreamOk, b.upstreamOk);
});
