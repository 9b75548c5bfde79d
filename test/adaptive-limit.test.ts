// The adaptive concurrency limit (gradient controller) with exact numbers from a fake clock, and how the
// memory governor enforces it: effective = min(max_concurrent, adaptive), never under adaptiveMin.
import t from 'tap';
import { AdaptiveLimit, SampleKind } from '../src/governor/adaptive-limit.js';

import { SINGLE_PROCESS_GOVERNORS, pool } from './helpers/governor-suite.js';

const { Ok, Dropped, Throttled } = SampleKind;

/** One-window short average, full smoothing and a frozen long-term RTT: each window's step is exact. */
const exact = (over: Partial<ConstructorParameters<typeof AdaptiveLimit>[0]> = {}) =>
  new AdaptiveLimit({ min: 1, max: 100, initial: 20, windowSamples: 2, shortWindows: 1, smoothing: 1, longTauMs: Infinity, probeIntervalMs: 1e9, ...over });

const round = (n: number) => Math.round(n * 1e6) / 1e6;

t.test('gradient: no queueing grows by the allowance; latency above the baseline shrinks by long/short', async (t) => {
  const a = exact();
  t.equal(a.onSample(0, 100, 20, Ok), 20, 'the first sample only sets both RTTs');
  t.equal(a.shortRtt, 100);
  t.equal(a.longRtt, 100);
  t.equal(a.onSample(50, 100, 20, Ok), 20, 'a window needs 2 samples and one long RTT (100 ms)');
  // Window [0,100): mean 100 = long, gradient 1: 20 + sqrt(20)/2.
  t.equal(a.onSample(100, 100, 20, Ok), 22);
  t.equal(round(a.estimate), round(20 + Math.sqrt(20) / 2));
  // Window [100,200): mean 200, long/short = 0.5: 22.236·0.5 + sqrt(22.236)/2 = 13.4758.
  t.equal(a.onSample(150, 200, 22, Ok), 22, 'nothing moves inside a window');
  t.equal(a.onSample(200, 200, 22, Ok), 13);
  t.equal(round(a.estimate), 13.475791);
  t.equal(a.shortRtt, 200);
  // Window [200,300): mean 125, gradient 0.8: 13.4758·0.8 + sqrt(13.4758)/2 = 12.6161.
  a.onSample(250, 125, 13, Ok);
  t.equal(a.onSample(300, 125, 13, Ok), 12);
  t.equal(round(a.estimate), 12.616102);
});

t.test('gradient is clamped: one window never more than halves the limit', async (t) => {
  const a = exact({ initial: 40 });
  a.onSample(0, 100, 40, Ok);
  a.onSample(50, 1000, 40, Ok);
  // Mean 550 → long/short 0.18, clamped to 0.5: 40·0.5 + sqrt(40)/2 = 23.16.
  t.equal(a.onSample(100, 100, 40, Ok), 23);
  t.equal(round(a.estimate), round(20 + Math.sqrt(40) / 2));
});

t.test('an idle pool does not grow the limit; shrinking still applies', async (t) => {
  const a = exact();
  a.onSample(0, 100, 20, Ok);
  a.onSample(50, 100, 3, Ok);
  t.equal(a.onSample(100, 100, 3, Ok), 20, 'at most 3 of 20 in flight during the window: no growth');
  t.equal(a.estimate, 20);
  a.onSample(150, 200, 3, Ok);
  t.equal(a.onSample(200, 200, 3, Ok), 12, 'latency doubled: 20·0.5 + sqrt(20)/2 = 12.24');
});

t.test('a dropped sample is not latency: it changes nothing and does not count towards a window', async (t) => {
  const a = exact();
  a.onSample(0, 100, 20, Ok);
  t.equal(a.onSample(50, 5, 20, Dropped), 20);
  t.equal(a.onSample(100, 5, 20, Dropped), 20);
  t.equal(a.shortRtt, 100, 'the short-term RTT ignores dropped samples');
  t.equal(a.onSample(110, 100, 20, Ok), 20, 'one valid sample: the window is still open');
  t.equal(a.onSample(120, 100, 20, Ok), 22, 'the second valid sample closes it');
});

t.test('throttled: multiplicative backoff, at most once per short RTT, never below the floor', async (t) => {
  const a = exact({ min: 15 });
  a.onSample(0, 100, 20, Ok);
  t.equal(a.onSample(10, 2, 20, Throttled), 18, '20 · 0.9');
  t.equal(a.onSample(60, 2, 20, Throttled), 18, 'a second 429 within one short RTT (100 ms) is the same overload');
  t.equal(a.onSample(110, 2, 20, Throttled), 16, '18 · 0.9 = 16.2');
  t.equal(a.onSample(210, 2, 20, Throttled), 15, '16.2 · 0.9 = 14.58, floored at adaptiveMin 15');
  t.equal(a.onSample(310, 2, 20, Throttled), 15);
  t.equal(a.estimate, 15);
});

t.test('bounds: never above max; setBounds clamps the current limit', async (t) => {
  const a = exact({ max: 21 });
  a.onSample(0, 100, 20, Ok);
  a.onSample(50, 100, 20, Ok);
  t.equal(a.onSample(100, 100, 20, Ok), 21, '22.24 capped at max 21');
  a.setBounds(5, 10);
  t.equal(a.limit, 10);
  a.setBounds(12, 50);
  t.equal(a.limit, 12, 'a raised floor lifts the limit');
  a.setBounds(80, 50);
  t.equal(a.limit, 50, 'a floor above the ceiling is the ceiling');
});

t.test('probe: half the limit for a few round trips; the measured mean becomes the long-term RTT', async (t) => {
  const a = exact({ initial: 40, probeIntervalMs: 1000, probeSamples: 4 });
  a.onSample(0, 100, 40, Ok); // next probe at 1000
  t.equal(a.onSample(1000, 300, 40, Ok), 20, 'the probe starts: 40 · 0.5');
  t.ok(a.probing);
  // R = 100 (short and long are 100): starts in [1100, 1200) are measured (4 samples / 20 slots < 1 R);
  // the probe ends at 1400.
  t.equal(a.onSample(1150, 120, 40, Ok), 20, 'started at 1030, during the drain: skipped');
  a.onSample(1250, 140, 20, Ok); // started 1110: measured
  a.onSample(1300, 160, 20, Ok); // started 1140: measured
  a.onSample(1390, 200, 20, Ok); // started 1190: measured
  t.equal(a.longRtt, 100, 'the baseline changes only when the probe ends');
  t.equal(a.onSample(1400, 100, 20, Ok), 40, 'started 1300, after the span: skipped; the probe ends');
  t.notOk(a.probing);
  t.equal(round(a.longRtt), round((140 + 160 + 200) / 3), 'the long-term RTT is the probe mean (up: the upstream got slower)');
});

t.test('a probe with too few answers keeps the old baseline', async (t) => {
  const a = exact({ initial: 40, probeIntervalMs: 1000, probeSamples: 10 });
  a.onSample(0, 100, 40, Ok);
  a.onSample(1000, 100, 40, Ok);
  a.onSample(1150, 50, 20, Ok); // one measured sample of the 5 needed
  a.onSample(1500, 100, 20, Ok); // the probe (R 100, span 100 · 10/20 → 100) ended at 1400
  t.notOk(a.probing);
  t.equal(a.longRtt, 100);
});

for (const [kind, make] of SINGLE_PROCESS_GOVERNORS) {
  t.test(`${kind} governor: effective = min(max_concurrent, adaptive), following the controller`, async (t) => {
    let now = 0;
    const gov = make({ now: () => now });
    t.teardown(() => gov.close());
    gov.configure([pool(1, { maxConcurrent: 10, adaptive: true, adaptiveMin: 8 }), pool(2, { maxConcurrent: 10 })], []);
    t.equal(gov.state(1).effectiveLimit, 10, 'starts at max_concurrent');
    const take = (id: number) => {
      const a = gov.acquire({ poolId: id, waitMs: 0 });
      if (a instanceof Promise || !a.ok) throw new Error('expected a slot');
      return a.permit;
    };
    take(1).release({ status: 429, throttled: 1, latencyMs: 5 });
    t.equal(gov.state(1).effectiveLimit, 9, 'an upstream 429 backs off: 10 · 0.9');
    now += 10;
    take(1).release({ status: 200, throttled: 2, latencyMs: 5 });
    t.equal(gov.state(1).effectiveLimit, 9, 'within the same round trip (100 ms while no RTT is known): once');
    now += 100;
    take(1).release({ status: 429, latencyMs: 5 });
    t.equal(gov.state(1).effectiveLimit, 8, '9 · 0.9 = 8.1');
    now += 100;
    take(1).release({ status: 429, latencyMs: 5 });
    t.equal(gov.state(1).effectiveLimit, 8, 'never under adaptiveMin');
    const held = Array.from({ length: 8 }, () => take(1));
    t.match(gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' }, 'the adaptive limit is enforced');
    for (const p of held) p.release({ dropped: true });

    take(2).release({ status: 429, latencyMs: 5 });
    t.equal(gov.state(2).effectiveLimit, 10, 'adaptive absent (off): the limit is max_concurrent');
    t.equal(gov.learned(2)?.adaptiveLimit, null);

    gov.configure([pool(1, { maxConcurrent: 5, adaptive: true, adaptiveMin: 8 })], []);
    t.equal(gov.state(1).effectiveLimit, 5, 'lowering max_concurrent caps the adaptive limit (and the floor)');
    gov.configure([pool(1, { maxConcurrent: 10, adaptive: false })], []);
    t.equal(gov.state(1).effectiveLimit, 10, 'adaptive switched off: max_concurrent');
  });

  t.test(`${kind} governor: a 429 the rate headers explain (remaining 0) is a rate signal, not a concurrency one`, async (t) => {
    const gov = make({ now: () => 0, wallClock: () => 0 });
    t.teardown(() => gov.close());
    gov.configure([pool(1, { maxConcurrent: 10, adaptive: true })], []);
    const a = gov.acquire({ poolId: 1, waitMs: 0 });
    if (a instanceof Promise || !a.ok) throw new Error('expected a slot');
    a.permit.release({ status: 429, latencyMs: 5, headers: { 'x-ratelimit-limit': '600', 'x-ratelimit-remaining': '0', 'x-ratelimit-reset': '7' } });
    t.equal(gov.state(1).effectiveLimit, 10, 'the concurrency limit stays');
    t.match(gov.learned(1), { learnedRpm: 600, gateWaitMs: 7000 }, 'the window is spent: admissions pause until its reset');
  });
}
