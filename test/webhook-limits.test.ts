// Pure parts of the deliverer (issue 18): the per-destination adaptive in-flight limit (grows while the
// receiver answers fast, backs off on errors and on slow answers, within the ceiling) and the per-destination
// failure-streak summary a batch of outcomes is written with (8 consecutive failures deactivate).
import t from 'tap';
import { DestinationLimit } from '../src/webhooks/destination-limit.js';
import { streakChanges, type Outcome } from '../src/webhooks/outcomes.js';

/** One send finished after `ms`, with the limit fully in use (as under a backlog). */
function finish(l: DestinationLimit, ok: boolean, ms: number, now: number): void {
  l.inFlight = l.limit - 1;
  l.onOutcome(ok, ms, now);
}

t.test('the limit grows while the receiver answers fast, up to the ceiling', async (t) => {
  const l = new DestinationLimit({ initial: 8, min: 1, max: 64 });
  t.equal(l.limit, 8);
  for (let i = 0; i < 8; i++) finish(l, true, 5, i);
  t.equal(l.limit, 16, 'slow start: +1 per fast success (doubles per round of 8)');
  for (let i = 0; i < 500; i++) finish(l, true, 5, 100 + i);
  t.equal(l.limit, 64, 'never above the ceiling');
  // Light traffic (the limit is not what holds sends back) does not grow it.
  const light = new DestinationLimit({ initial: 8, min: 1, max: 64 });
  for (let i = 0; i < 50; i++) {
    light.inFlight = 0;
    light.onOutcome(true, 5, i);
  }
  t.equal(light.limit, 8, 'no growth without demand');
});

t.test('errors halve it (once per window), slow answers take 10% off, never below 1', async (t) => {
  const l = new DestinationLimit({ initial: 32, min: 1, max: 64 });
  finish(l, true, 5, 0);
  finish(l, false, 5, 1000);
  t.equal(l.limit, 16, 'a failure halves');
  finish(l, false, 5, 1010);
  t.equal(l.limit, 16, 'simultaneous failures (within 100 ms) count once');
  for (let i = 0; i < 10; i++) finish(l, false, 5, 2000 + i * 200);
  t.equal(l.limit, 1, 'a failing receiver ends up with one slot');
  const s = new DestinationLimit({ initial: 32, min: 1, max: 64 });
  finish(s, true, 5, 0);
  finish(s, true, 100, 200);
  t.equal(s.limit, 34, 'a little slower than the baseline is noise, not congestion (it grows)');
  finish(s, true, 600, 400);
  t.equal(s.limit, 30, 'much slower (4× and +250 ms): 10% off');
});

const o = (dest: number, ok: boolean): Outcome => ({
  rowId: '1', dest, jobId: 'job_x', poolId: null, ok, status: ok ? 200 : 500, error: ok ? null : 'HTTP 500', attempt: 1, latencyMs: 1, retryMs: ok ? null : 10,
});

t.test('a batch sums each destination\'s streak in the order outcomes came back', async (t) => {
  t.same(streakChanges([o(1, false), o(1, false), o(2, true), o(1, false)]), [
    { dest: 1, reset: false, before: 3, after: 0, inner: 0 },
    { dest: 2, reset: true, before: 0, after: 0, inner: 0 },
  ], 'no success: the streak grows by every failure');
  t.same(streakChanges([o(1, false), o(1, true), o(1, false), o(1, false), o(1, true), o(1, false)]), [
    { dest: 1, reset: true, before: 1, after: 1, inner: 2 },
  ], 'failures before the first success extend the old streak; the run after the last success is the new one; the longest run between counts for deactivation');
});
