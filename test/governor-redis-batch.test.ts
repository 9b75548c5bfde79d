// The Redis governor's batching (issue #4): the acquires one node makes for a pool in one event-loop turn are
// one ACQUIRE script call, its releases one RELEASE call, and each caller is decided exactly as if it had
// run alone in arrival order: never more than the limit, first come first served, nothing left behind.
// A private redis-server, so INFO commandstats counts this node's calls only.
import t, { type Test } from 'tap';
import { Redis } from 'ioredis';
import { RedisGovernor } from '../src/governor/redis.js';
import type { Admission, BudgetLimits, Permit, PoolLimits } from '../src/governor/governor.js';
import { pool } from './helpers/governor-suite.js';
import { needServer } from './helpers/servers.js';
import { freePort, startRedisServer } from './helpers/redis-server.js';

if (await needServer('redis')) {
  t.pass('skipped: no redis-server');
  process.exit(0);
}

const port = await freePort();
const server = await startRedisServer(port);
const admin = new Redis({ port });
t.teardown(async () => {
  admin.disconnect();
  server.kill('SIGKILL');
});

let n = 0;
/** A governor of its own key prefix, configured with `pools`, closed with the test. */
async function make(t: Test, pools: PoolLimits[], budgets: BudgetLimits[] = []): Promise<RedisGovernor> {
  // A long term: no lease refresh (itself a script call) runs during a test.
  const gov = new RedisGovernor({ url: `redis://127.0.0.1:${port}`, prefix: `batch${++n}:`, termMs: 120_000 });
  await gov.ready();
  t.teardown(() => gov.close());
  gov.configure(pools, budgets);
  return gov;
}

/** Leases of pool 1 in Redis (the latest governor's prefix). */
const leases = () => admin.zcard(`batch${n}:{p:1}:1:slots`);

/** Script calls Redis ran while `fn` ran (and everything it started was answered). */
async function scriptCalls<T>(gov: RedisGovernor, fn: () => Promise<T>): Promise<{ calls: number; value: T }> {
  await admin.config('RESETSTAT');
  const value = await fn();
  await gov.redis.ping();
  const m = /cmdstat_evalsha:calls=(\d+)/.exec(await admin.info('commandstats'));
  return { calls: m ? Number(m[1]) : 0, value };
}

/** `count` fail-fast acquires of pool 1 made in one turn, and the script calls they took. */
const acquireInOneTurn = (gov: RedisGovernor, count: number) =>
  scriptCalls(gov, () => Promise.all(Array.from({ length: count }, () => gov.acquire({ poolId: 1, waitMs: 0 }))));

const permit = (a: Admission): Permit => {
  if (!a.ok) throw new Error(`expected an admission, got ${a.reason}`);
  return a.permit;
};

t.test('one uncontended acquire is one script call, and its release another', async (t) => {
  const gov = await make(t, [pool(1, { maxConcurrent: 5 })]);
  const acquired = await scriptCalls(gov, async () => gov.acquire({ poolId: 1, waitMs: 1000 }));
  t.equal(acquired.calls, 1, 'one round trip to acquire');
  t.match(acquired.value, { ok: true, queued: false });
  const released = await scriptCalls(gov, async () => permit(acquired.value).release());
  t.equal(released.calls, 1, 'one round trip to release');
  t.equal(await leases(), 0, 'no lease left');
});

t.test("one turn's acquires are one call; the limit holds and the first comers get the slots", async (t) => {
  const gov = await make(t, [pool(1, { maxConcurrent: 3, queueLength: 0 })]);
  const { calls, value: answers } = await acquireInOneTurn(gov, 8);
  t.equal(calls, 1, 'eight callers, one script call');
  t.same(
    answers.map((a) => a.ok),
    [true, true, true, false, false, false, false, false],
    'the first three in arrival order are admitted, the rest refused',
  );
  t.match(answers[3], { ok: false, reason: 'no_slot' });
  t.equal(gov.state(1).inFlight, 3);
  const released = await scriptCalls(gov, async () => {
    for (const a of answers) if (a.ok) a.permit.release();
  });
  t.equal(released.calls, 1, "one turn's three releases, one script call");
  t.equal(gov.state(1).inFlight, 0);
  t.equal(await leases(), 0, 'no lease left');
});

t.test('a turn larger than one call is split; every caller is still decided once, in order', async (t) => {
  const gov = await make(t, [pool(1, { maxConcurrent: 200, queueLength: 0 })]);
  const { calls, value: answers } = await acquireInOneTurn(gov, 300);
  t.ok(calls >= 2 && calls <= 3, `300 callers in ${calls} calls`);
  const admitted = answers.map((a) => a.ok);
  t.equal(admitted.filter(Boolean).length, 200, 'exactly the limit admitted');
  t.ok(admitted.slice(0, 200).every(Boolean) && !admitted.slice(200).some(Boolean), 'the first 200 in arrival order');
  t.equal(await leases(), 200, 'one lease per admitted caller');
  for (const a of answers) if (a.ok) a.permit.release();
  await gov.redis.ping();
  await gov.redis.ping();
  t.equal(await leases(), 0, 'every lease released');
});

t.test("waiters who arrived in one turn are admitted in arrival order, one per release", async (t) => {
  const gov = await make(t, [pool(1, { maxConcurrent: 1, queueLength: 10 })]);
  const held = permit(await gov.acquire({ poolId: 1, waitMs: 0 }));
  const order: number[] = [];
  const waiters = Array.from({ length: 5 }, (_, i) =>
    (gov.acquire({ poolId: 1, waitMs: 20_000 }) as Promise<Admission>).then((a) => {
      order.push(i);
      return a;
    }),
  );
  // Their first (refused) attempts come back and they queue; a release in that same turn would be sent first.
  await new Promise((r) => setTimeout(r, 300));
  let current = held;
  for (let i = 0; i < 5; i++) {
    current.release();
    const a = await waiters[i]!;
    t.match(a, { ok: true, queued: true }, `waiter ${i} admitted after waiting`);
    current = permit(a);
  }
  current.release();
  t.same(order, [0, 1, 2, 3, 4], 'FIFO');
});

t.test('a capped budget: callers of two pools in one turn never pass the cap or a pool limit', async (t) => {
  const gov = await make(
    t,
    [pool(1, { maxConcurrent: 4, budgetId: 7, reservedConcurrent: 1, queueLength: 0 }), pool(2, { maxConcurrent: 4, budgetId: 7, reservedConcurrent: 2, queueLength: 0 })],
    [{ budgetId: 7, originMaxConcurrent: 5 }],
  );
  const calls = [1, 2, 1, 2, 1, 2, 1, 2, 1, 1, 2, 2].map((poolId) => gov.acquire({ poolId, waitMs: 0 }));
  const answers = await Promise.all(calls);
  const per = [1, 2].map((id) => answers.filter((a, i) => a.ok && [1, 2, 1, 2, 1, 2, 1, 2, 1, 1, 2, 2][i] === id).length);
  t.equal(per[0]! + per[1]!, 5, 'the budget cap, exactly');
  t.ok(per[0]! <= 4 && per[1]! <= 4, `pool limits hold (${per.join(', ')})`);
  t.ok(per[1]! >= 2, "pool 2's reserve of 2 is kept");
  for (const a of answers) if (a.ok) a.permit.release();
});

t.test('a slot released in a turn is free for the acquires of that turn (releases go first)', async (t) => {
  const gov = await make(t, [pool(1, { maxConcurrent: 1, queueLength: 0 })]);
  const held = permit(await gov.acquire({ poolId: 1, waitMs: 0 }));
  const next = gov.acquire({ poolId: 1, waitMs: 0 });
  held.release();
  const a = await next;
  t.match(a, { ok: true, queued: false }, 'admitted, though it asked before the release in the same turn');
  permit(a).release();
});
