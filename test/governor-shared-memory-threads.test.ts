// The shared-memory governor across real worker threads: one pool's limit and budget under random load
// with timeouts and aborts, FIFO order across threads, hand-over from one thread's release to another's waiter.
import t from 'tap';
import { once } from 'node:events';
import { SharedMemoryGovernor } from '../src/governor/shared-memory.js';
import type { Admission } from '../src/governor/governor.js';
import type { LoadPlan, LoadResult } from './helpers/shared-governor-worker.js';
import { counters, driven, spawn } from './helpers/shared-governor-threads.js';
import { sleep, until } from './helpers/until.js';
import { pool } from './helpers/governor-suite.js';

t.test('4 workers under random load: in-flight never exceeds the pool or budget limit; all settle; nothing left', async (t) => {
  const gov = new SharedMemoryGovernor();
  t.teardown(() => gov.close());
  // Pool 1 alone (limit 5); pools 2–4 share budget 9 (cap 6; reserves 2, 1, 0; own limits 4, 4, 6).
  gov.configure(
    [
      pool(1, { maxConcurrent: 5, queueLength: 1000 }),
      pool(2, { maxConcurrent: 4, queueLength: 1000, budgetId: 9, reservedConcurrent: 2 }),
      pool(3, { maxConcurrent: 4, queueLength: 1000, budgetId: 9, reservedConcurrent: 1 }),
      pool(4, { maxConcurrent: 6, queueLength: 1000, budgetId: 9 }),
    ],
    [{ budgetId: 9, originMaxConcurrent: 6 }],
  );
  const shared = counters();
  const plan = (seed: number): LoadPlan => ({
    pools: [
      { poolId: 1, limit: 5, counter: 1, budgetCounter: -1, budgetLimit: 0 },
      { poolId: 1, limit: 5, counter: 1, budgetCounter: -1, budgetLimit: 0 },
      { poolId: 2, limit: 4, counter: 2, budgetCounter: 9, budgetLimit: 6 },
      { poolId: 3, limit: 4, counter: 3, budgetCounter: 9, budgetLimit: 6 },
      { poolId: 4, limit: 6, counter: 4, budgetCounter: 9, budgetLimit: 6 },
    ],
    ops: 600,
    concurrency: 24,
    seed,
    maxWaitMs: 150,
    maxHoldMs: 6,
    abortShare: 0.15,
  });
  const workers = [1, 2, 3, 4].map((n) => spawn(gov.handle(), 'load', shared, plan(20261124 + n)));
  // The main thread samples the shared counts meanwhile: never above a limit, never negative.
  let sampling = true;
  let samples = 0;
  const sampler = (async () => {
    while (sampling) {
      // Each state() is one locked read, so each pool is checked against its own limit here; the budget's
      // sum is checked by the workers' holder counts (three separate reads can straddle a slot that moves
      // from one budget pool to another, and over-count by one).
      const over = [1, 2, 3, 4].map((id) => [id, gov.state(id).inFlight, id === 1 ? 5 : id === 4 ? 6 : 4] as const).filter(([, n, max]) => n > max || n < 0);
      if (over.length > 0) t.fail(`state over the limit: ${over.map(([id, n]) => `pool ${id} ${n}`).join(', ')}`);
      samples++;
      await sleep(1);
    }
  })();
  const exits = workers.map((w) => once(w, 'exit'));
  const results = (await Promise.all(workers.map(async (w) => (await once(w, 'message'))[0] as { result: LoadResult }))).map((m) => m.result);
  sampling = false;
  await sampler;
  await Promise.all(exits);
  const checks = new Int32Array(shared.checks);
  t.equal(checks[0], 0, 'no thread ever saw more holders than the pool or budget limit');
  let admitted = 0;
  const refused: Record<string, number> = {};
  for (const r of results) {
    admitted += r.admitted;
    for (const [k, n] of Object.entries(r.refused)) refused[k] = (refused[k] ?? 0) + n;
  }
  const settled = admitted + Object.values(refused).reduce((s, n) => s + n, 0);
  t.equal(settled, 4 * 600, 'every acquire was answered');
  t.ok(admitted > 600, `most acquires were admitted (${admitted}; refused ${JSON.stringify(refused)})`);
  t.ok((refused.queue_timeout ?? 0) + (refused.aborted ?? 0) > 0, 'waits timed out and aborted along the way');
  t.ok(samples > 10, `the main thread sampled the state ${samples} times`);
  for (const id of [1, 2, 3, 4]) t.same(gov.state(id), { inFlight: 0, queued: 0, effectiveLimit: id === 4 ? 6 : id === 1 ? 5 : 4, remaining: id === 1 ? 5 : id === 4 ? 3 : 4 }, `pool ${id} drained (pool 4 borrows only the 3 unallocated)`);
  const holders = new Int32Array(shared.holders);
  t.same([holders[1], holders[2], holders[3], holders[4], holders[9]], [0, 0, 0, 0, 0]);
});

t.test('FIFO across threads: waiters queued by 4 workers are served exactly in arrival order', async (t) => {
  const gov = new SharedMemoryGovernor();
  t.teardown(() => gov.close());
  gov.configure([pool(1, { maxConcurrent: 1, queueLength: 100, queueTimeoutMs: 60_000 })], []);
  const shared = counters();
  const ws = await Promise.all([1, 2, 3, 4].map(() => driven(gov, t, shared)));
  const held = gov.acquire({ poolId: 1, waitMs: 0 }) as Admission;
  if (!held.ok) throw new Error('expected the slot');
  // 24 waiters from the workers in a scrambled order; each is in the queue before the next is sent.
  const who: number[] = [];
  for (let i = 0; i < 24; i++) {
    const w = (i * 7 + (i >> 2)) % 4;
    who.push(w);
    ws[w]!.send({ cmd: 'acquire', id: i, poolId: 1, waitMs: 60_000 });
    await until(`waiter ${i} queued`, () => gov.state(1).queued === i + 1, 30_000, 2);
  }
  held.permit.release();
  // Each waiter, once granted, releases; the next one is then granted (in whichever thread it waits).
  const orders: number[] = [];
  for (let i = 0; i < 24; i++) {
    const r = await ws[who[i]!]!.reply((m) => m.id === i);
    t.ok(r.ok, `waiter ${i} admitted`);
    orders.push(r.order!);
    ws[who[i]!]!.send({ cmd: 'release', id: i });
  }
  t.same(orders, Array.from({ length: 24 }, (_, i) => i), 'grant order equals arrival order across threads');
  await until('the last release', () => gov.state(1).inFlight === 0, 30_000, 2);
  t.same(gov.state(1), { inFlight: 0, queued: 0, effectiveLimit: 1, remaining: 1 });
});

t.test('a release in one worker hands the slot to a waiter in another; timeouts and aborts there leave the queue', async (t) => {
  const gov = new SharedMemoryGovernor();
  t.teardown(() => gov.close());
  gov.configure([pool(1, { maxConcurrent: 1, queueLength: 2 })], []);
  const [a, b] = await Promise.all([driven(gov, t), driven(gov, t)]);
  a!.send({ cmd: 'acquire', id: 1, poolId: 1, waitMs: 0 });
  t.match(await a!.reply((r) => r.id === 1), { ok: true });
  b!.send({ cmd: 'acquire', id: 2, poolId: 1, waitMs: 100 });
  t.match(await b!.reply((r) => r.id === 2), { ok: false, reason: 'queue_timeout' }, 'a waiter in worker B times out');
  b!.send({ cmd: 'acquire', id: 3, poolId: 1, waitMs: 30_000 });
  b!.send({ cmd: 'acquire', id: 4, poolId: 1, waitMs: 30_000 });
  await until('two waiters', () => gov.state(1).queued === 2, 30_000, 2);
  t.match(gov.acquire({ poolId: 1, waitMs: 1000 }), { ok: false, reason: 'queue_full' }, 'the queue limit counts waiters of every thread');
  b!.send({ cmd: 'abort', id: 3 });
  t.match(await b!.reply((r) => r.id === 3), { ok: false, reason: 'aborted' });
  t.equal(gov.state(1).queued, 1);
  a!.send({ cmd: 'release', id: 1 });
  t.match(await b!.reply((r) => r.id === 4), { ok: true }, "worker A's release admitted worker B's waiter");
  t.same(gov.state(1), { inFlight: 1, queued: 0, effectiveLimit: 1, remaining: 0 });
  // The main thread waits too: a release in worker B rings it.
  const mine = gov.acquire({ poolId: 1, waitMs: 30_000 });
  t.ok(mine instanceof Promise);
  b!.send({ cmd: 'release', id: 4 });
  const got = await mine;
  t.ok(got.ok, "worker B's release admitted the main thread's waiter");
  if (got.ok) got.permit.release();
  t.same(gov.state(1), { inFlight: 0, queued: 0, effectiveLimit: 1, remaining: 1 });
});

t.test("budget across threads: a freed slot goes to the oldest waiter among the budget's pools, whatever its thread", async (t) => {
  const gov = new SharedMemoryGovernor();
  t.teardown(() => gov.close());
  gov.configure([pool(1, { maxConcurrent: 5, budgetId: 1 }), pool(2, { maxConcurrent: 5, budgetId: 1 })], [{ budgetId: 1, originMaxConcurrent: 2 }]);
  const [a, b] = await Promise.all([driven(gov, t), driven(gov, t)]);
  a!.send({ cmd: 'acquire', id: 1, poolId: 1, waitMs: 0 });
  a!.send({ cmd: 'acquire', id: 2, poolId: 1, waitMs: 0 });
  await a!.reply((r) => r.id === 1);
  await a!.reply((r) => r.id === 2);
  // Worker B waits on pool 2 first, then the main thread on pool 1.
  b!.send({ cmd: 'acquire', id: 3, poolId: 2, waitMs: 30_000 });
  await until("worker B's waiter", () => gov.state(2).queued === 1, 30_000, 2);
  const mine = gov.acquire({ poolId: 1, waitMs: 30_000 });
  t.ok(mine instanceof Promise);
  a!.send({ cmd: 'release', id: 1 });
  t.match(await b!.reply((r) => r.id === 3), { ok: true }, "pool 2's older waiter in worker B took pool 1's freed slot");
  t.equal(gov.state(1).queued, 1, 'the main thread still waits');
  a!.send({ cmd: 'release', id: 2 });
  const got = await mine;
  t.ok(got.ok, 'then the main thread');
  if (got.ok) got.permit.release();
  b!.send({ cmd: 'release', id: 3 });
  await until('the last release', () => gov.state(2).inFlight === 0, 30_000, 2);
  t.equal(gov.state(1).inFlight + gov.state(2).inFlight, 0);
});
