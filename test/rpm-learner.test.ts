// The RPM learner and gate with a fake clock: what it learns from a stated limit, how the token bucket
// admits, retry-after and spent windows pausing, rpmOverride; the memory governor's rate_limited refusal;
// and end to end through the data plane against a real https origin.
import t from 'tap';
import { Pool } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { emptyRateInfo, type RateInfo } from '../src/governor/rate-headers.js';
import { RpmLearner } from '../src/governor/rpm-learner.js';

import { refusalReply } from '../src/pool-request/refusal.js';
import { SINGLE_PROCESS_GOVERNORS, pool } from './helpers/governor-suite.js';
import { SimClock } from './helpers/adaptive-sim.js';

const said = (over: Partial<RateInfo>): RateInfo => ({ ...emptyRateInfo(), ...over });

/** How many `allows`+`take` succeed at `now`. */
function drain(l: RpmLearner, now: number): number {
  let n = 0;
  while (l.allows(now) && n < 1e6) {
    l.take(now);
    n++;
  }
  return n;
}

t.test('nothing said: the gate is open', async (t) => {
  const l = new RpmLearner();
  t.ok(l.allows(0));
  t.equal(l.waitMs(0), 0);
  t.ok(Number.isNaN(l.learnedRpm));
  t.ok(Number.isNaN(l.gateRpm));
});

t.test('a stated limit is learned per minute; the gate is a token bucket at margin · rpm', async (t) => {
  const l = new RpmLearner({ margin: 1 });
  l.observe(0, said({ limit: 600 }));
  t.equal(l.learnedRpm, 600);
  t.equal(l.gateRpm, 600);
  t.equal(drain(l, 0), 10, 'the bucket holds one second of the rate (600/60)');
  t.equal(l.waitMs(0), 100, 'the next token in 60000/600 ms');
  t.equal(drain(l, 50), 0);
  t.equal(drain(l, 100), 1);
  t.equal(drain(l, 60_100), 10, 'a quiet minute refills only the burst');
  // Over a busy minute the gate admits the rate, not more.
  let admitted = 0;
  for (let now = 60_101; now <= 120_100; now += 1) admitted += drain(l, now);
  t.equal(admitted, 600, 'polled every ms for the next minute: one per 100 ms');
});

t.test('the default margin keeps the gate 3% under the stated figure; remaining caps the first burst', async (t) => {
  const l = new RpmLearner();
  l.observe(0, said({ limit: 1200, remaining: 4 }));
  t.equal(l.learnedRpm, 1200);
  t.equal(Math.round(l.gateRpm), 1164);
  t.equal(drain(l, 0), 4, 'the window had 4 left: the bucket starts with 4');
});

t.test('a stated window scales to a minute', async (t) => {
  const l = new RpmLearner();
  l.observe(0, said({ limit: 100, windowMs: 10_000 }));
  t.equal(l.learnedRpm, 600);
});

t.test('retry-after pauses admissions until then (capped); a later, shorter hint does not shorten it', async (t) => {
  const l = new RpmLearner({ maxPauseMs: 60_000 });
  l.observe(1000, said({ retryAfterMs: 5000 }));
  t.notOk(l.allows(1000));
  t.equal(l.waitMs(1000), 5000);
  l.observe(2000, said({ retryAfterMs: 1000 }));
  t.equal(l.pausedUntil, 6000);
  t.notOk(l.allows(5999));
  t.ok(l.allows(6000));
  l.observe(10_000, said({ retryAfterMs: 3_600_000 }));
  t.equal(l.waitMs(10_000), 60_000, 'an hour-long hint pauses at most maxPauseMs');
});

t.test('a spent window (remaining 0) pauses until its reset', async (t) => {
  const l = new RpmLearner();
  l.observe(0, said({ limit: 600, remaining: 0, resetMs: 12_000 }));
  t.equal(l.waitMs(0), 12_000);
  l.observe(20_000, said({ limit: 600, remaining: 3, resetMs: 1_000 }));
  t.ok(l.allows(20_000), 'remaining > 0 does not pause');
});

t.test('rpmOverride fixes the gate whatever is learned; null hands it back', async (t) => {
  const l = new RpmLearner({ margin: 1 });
  l.setOverride(60, 0);
  t.equal(l.gateRpm, 60);
  l.observe(0, said({ limit: 6000 }));
  t.equal(l.learnedRpm, 6000, 'still learned (reported)');
  t.equal(l.gateRpm, 60, 'but the override gates');
  t.equal(drain(l, 0), 1);
  t.equal(l.waitMs(0), 1000);
  l.setOverride(null, 0);
  t.equal(l.gateRpm, 6000);
});

t.test('token limits are recorded, not gated', async (t) => {
  const l = new RpmLearner();
  l.observe(0, said({ tokenLimit: 90_000 }));
  t.equal(l.tokenLimit, 90_000);
  t.ok(l.allows(0));
});

for (const [kind, make] of SINGLE_PROCESS_GOVERNORS) {
  t.test(`${kind} governor: a shut gate refuses with rate_limited and a Retry-After; the dataplane answers 429`, async (t) => {
    const clock = new SimClock();
    const gov = make({ now: () => clock.now, timers: clock });
    t.teardown(() => gov.close());
    gov.configure([pool(1, { maxConcurrent: 100, queueTimeoutMs: 10_000, rpmOverride: 60 })], []);
    const first = gov.acquire({ poolId: 1, waitMs: 0 });
    t.match(first, { ok: true }, 'one token in the bucket (60/min holds one)');
    t.equal(gov.state(1).remaining, 0, 'no remaining slots while the gate is shut (99 are free)');
    const refused = gov.acquire({ poolId: 1, waitMs: 0 });
    t.match(refused, { ok: false, reason: 'rate_limited', retryAfterMs: 1000 }, 'fail-fast: the gate reopens in 1 s');
    t.match(gov.acquire({ poolId: 1, waitMs: 500 }), { ok: false, reason: 'rate_limited' }, 'a wait shorter than the gate: refused at once');
    if (refused instanceof Promise || refused.ok) throw new Error('expected a refusal');
    const r = refusalReply(refused, [['x-service-effective-limit', '100']]);
    t.match(r, { status: 429, error: 'too_many_requests' });
    t.same(r?.headers?.[0], ['retry-after', '1']);

    // A wait that covers the gate: queued, and admitted when the gate reopens (a timer, no release needed).
    const waiting = gov.acquire({ poolId: 1, waitMs: 5000 });
    t.ok(waiting instanceof Promise);
    t.equal(gov.state(1).queued, 1);
    await clock.run(999, async () => {});
    t.equal(gov.state(1).queued, 1, 'still waiting at 999 ms');
    await clock.run(1000, async () => {});
    t.match(await waiting, { ok: true, queuedMs: 1000 });
    t.equal(gov.state(1).inFlight, 2);
  });

  t.test(`${kind} governor: a retry-after from the upstream pauses the whole pool, then it resumes`, async (t) => {
    const clock = new SimClock();
    const gov = make({ now: () => clock.now, timers: clock });
    t.teardown(() => gov.close());
    gov.configure([pool(1, { maxConcurrent: 10 })], []);
    const a = gov.acquire({ poolId: 1, waitMs: 0 });
    if (a instanceof Promise || !a.ok) throw new Error('expected a slot');
    a.permit.release({ status: 429, throttled: 1, retryAfterMs: 3000 });
    t.match(gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'rate_limited', retryAfterMs: 3000 });
    await clock.run(3000, async () => {});
    t.match(gov.acquire({ poolId: 1, waitMs: 0 }), { ok: true });
    // A retry hint on a success is not a refusal: it does not pause.
    const b = gov.acquire({ poolId: 1, waitMs: 0 });
    if (b instanceof Promise || !b.ok) throw new Error('expected a slot');
    b.permit.release({ status: 200, retryAfterMs: 60_000 });
    t.match(gov.acquire({ poolId: 1, waitMs: 0 }), { ok: true });
  });

  t.test(`${kind} governor: learns RPM from headers and from a lock release rate object (which wins)`, async (t) => {
    const gov = make({ now: () => 0, wallClock: () => 0 });
    t.teardown(() => gov.close());
    gov.configure([pool(1, { maxConcurrent: 10 })], []);
    const take = () => {
      const a = gov.acquire({ poolId: 1, waitMs: 0 });
      if (a instanceof Promise || !a.ok) throw new Error('expected a slot');
      return a.permit;
    };
    take().release({ status: 200, headers: { 'x-ratelimit-limit-requests': '3000', 'x-ratelimit-limit-tokens': '90000' } });
    t.match(gov.learned(1), { learnedRpm: 3000, tokenLimit: 90_000, adaptiveLimit: null });
    take().release({ status: 200, headers: { 'x-ratelimit-limit-requests': '3000' }, rate: { limit: 1200, tokenLimit: 5000 } });
    t.match(gov.learned(1), { learnedRpm: 1200, tokenLimit: 5000 });
    t.equal(Math.round(gov.learned(1)!.gateRpm!), 1164);
  });

  t.test(`${kind} governor: waiters held by the gate across a budget wake when it reopens`, async (t) => {
    const clock = new SimClock();
    const gov = make({ now: () => clock.now, timers: clock });
    t.teardown(() => gov.close());
    gov.configure(
      [pool(1, { maxConcurrent: 5, budgetId: 7, rpmOverride: 120 }), pool(2, { maxConcurrent: 5, budgetId: 7 })],
      [{ budgetId: 7, originMaxConcurrent: 10 }],
    );
    t.match(gov.acquire({ poolId: 1, waitMs: 0 }), { ok: true }, 'bucket of 2 at 120/min');
    t.match(gov.acquire({ poolId: 1, waitMs: 0 }), { ok: true });
    const w = gov.acquire({ poolId: 1, waitMs: 2000 });
    t.ok(w instanceof Promise, 'queued: the gate reopens in 500 ms');
    t.match(gov.acquire({ poolId: 2, waitMs: 0 }), { ok: true }, 'the other pool of the budget is not gated');
    await clock.run(500, async () => {});
    t.match(await w, { ok: true, queuedMs: 500 });
  });
}

t.test('data plane: an upstream retry-after pauses the pool (429 without reaching the origin); rpmOverride gates', async (t) => {
  const origin: Origin = await startOrigin();
  const svc: TestService = await startTestService({ overrides: { originCaFile: origin.caFile } });
  const proxy = new Pool(svc.proxyUrl!, { connections: 4 });
  t.teardown(async () => {
    await proxy.close();
    await svc.close();
    await origin.close();
  });
  const boot = await svc.bootstrap();
  const sql = svc.service.sql;
  const createPool = async (sub: string, settings: Record<string, unknown>) => {
    const { rows } = await sql.query<{ id: number }>(
      `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
       VALUES ($1, $2, $3, 'http', $4, $5, 10, false, $6::jsonb) RETURNING id`,
      [boot.team.id, sub, sub, origin.url, new URL(origin.url).host, JSON.stringify(settings)],
    );
    await sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
    await svc.service.dataplane!.snapshots.reload();
  };
  const call = async (sub: string, path: string, headers: Record<string, string> = {}) => {
    const res = await proxy.request({ path, method: 'GET', headers: { host: `${sub}.pools.localhost`, ...headers } });
    const text = await res.body.text();
    return { status: res.statusCode, headers: res.headers, json: JSON.parse(text) as Record<string, unknown> };
  };

  await createPool('paused', {});
  const upstream429 = await call('paused', '/status/429');
  t.equal(upstream429.status, 429, "the origin's 429 is passed through");
  t.equal(upstream429.headers['retry-after'], '7');
  const seen = origin.count;
  const gated = await call('paused', '/hello', { 'x-service-queue-timeout-ms': '2000' });
  t.equal(gated.status, 429, 'a request that will not wait out the pause is refused at once');
  t.match(gated.json, { error: 'too_many_requests', message: "the pool's request rate limit is reached" });
  const wait = Number(gated.headers['retry-after']);
  t.ok(wait >= 6 && wait <= 7, `Retry-After ${wait} s: what is left of the origin's 7 s`);
  t.equal(gated.headers['x-service-effective-limit'], '9', 'the 429 also backed the adaptive limit off (10 · 0.9)');
  t.equal((await call('paused', '/hello', { 'x-service-no-queue': '1' })).status, 429, 'and so is a fail-fast one');
  t.equal(origin.count, seen, 'the origin was not called while paused');

  await createPool('fixedrate', { rpmOverride: 1 });
  t.equal((await call('fixedrate', '/a')).status, 200, 'rpmOverride 1/min: the bucket holds one request');
  const second = await call('fixedrate', '/b');
  t.equal(second.status, 429);
  t.equal(second.headers['retry-after'], '60', 'the next token in a minute');
});
