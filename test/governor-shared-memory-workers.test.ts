// The shared-memory governor across real worker threads: a dead worker's slots come back (reclaim), close
// and reconfigure reach every thread, and the adaptive limit and RPM gate are one for all threads.
import t from 'tap';
import { SharedMemoryGovernor } from '../src/governor/shared-memory.js';
import type { Admission } from '../src/governor/governor.js';
import { counters, Driven, driven, spawn } from './helpers/shared-governor-threads.js';
import { sleep, until } from './helpers/until.js';
import { pool } from './helpers/governor-suite.js';

t.test('a worker that died holding slots and waiting: reclaim gives its slots back and serves the next waiter', async (t) => {
  const gov = new SharedMemoryGovernor();
  t.teardown(() => gov.close());
  gov.configure([pool(1, { maxConcurrent: 2 })], []);
  const handle = gov.handle();
  const d = new Driven(spawn(handle, 'commands', counters()));
  await d.reply((r) => r.ready === true);
  d.send({ cmd: 'acquire', id: 1, poolId: 1, waitMs: 0 });
  d.send({ cmd: 'acquire', id: 2, poolId: 1, waitMs: 0 });
  await d.reply((r) => r.id === 1);
  await d.reply((r) => r.id === 2);
  d.send({ cmd: 'acquire', id: 3, poolId: 1, waitMs: 30_000 });
  await until('the worker waiting', () => gov.state(1).queued === 1, 30_000, 2);
  const mine = gov.acquire({ poolId: 1, waitMs: 30_000 });
  t.ok(mine instanceof Promise, 'the main thread waits behind the worker');
  await d.worker.terminate();
  t.same(gov.state(1), { inFlight: 2, queued: 2, effectiveLimit: 2, remaining: 0 }, 'a dead worker still holds its slots');
  gov.reclaim(handle);
  const got = await mine;
  t.ok(got.ok, 'the main thread got a reclaimed slot');
  t.same(gov.state(1), { inFlight: 1, queued: 0, effectiveLimit: 2, remaining: 1 });
  if (got.ok) got.permit.release();
  const again = gov.handle();
  t.equal(again.thread, handle.thread, 'the thread slot is free for a new worker');
  gov.reclaim(again);
});

t.test('close: a worker detaching refuses its own waiters; the main close refuses every thread', async (t) => {
  const gov = new SharedMemoryGovernor();
  gov.configure([pool(1)], []);
  const [a, b] = await Promise.all([driven(gov, t), driven(gov, t)]);
  const held = gov.acquire({ poolId: 1, waitMs: 0 }) as Admission;
  a!.send({ cmd: 'acquire', id: 1, poolId: 1, waitMs: 30_000 });
  b!.send({ cmd: 'acquire', id: 2, poolId: 1, waitMs: 30_000 });
  await until('two waiters', () => gov.state(1).queued === 2, 30_000, 2);
  a!.send({ cmd: 'close' });
  t.match(await a!.reply((r) => r.id === 1), { ok: false, reason: 'unavailable' }, "worker A's close refused its waiter");
  t.equal(gov.state(1).queued, 1, "worker B's waiter still waits");
  await gov.close();
  t.match(await b!.reply((r) => r.id === 2), { ok: false, reason: 'unavailable' }, "the main close refused worker B's waiter");
  b!.send({ cmd: 'acquire', id: 3, poolId: 1, waitMs: 0 });
  t.match(await b!.reply((r) => r.id === 3), { ok: false, reason: 'unavailable' }, 'and every later acquire');
  if (held.ok) held.permit.release();
  t.equal(gov.state(1).inFlight, 0);
});

t.test('reconfigure in the main thread reaches the workers: a raised limit admits their waiters, a removed pool refuses them', async (t) => {
  const gov = new SharedMemoryGovernor();
  t.teardown(() => gov.close());
  gov.configure([pool(1, { maxConcurrent: 1 }), pool(2)], []);
  const w = await driven(gov, t);
  const held = gov.acquire({ poolId: 1, waitMs: 0 }) as Admission;
  w.send({ cmd: 'acquire', id: 1, poolId: 1, waitMs: 30_000 });
  w.send({ cmd: 'acquire', id: 2, poolId: 1, waitMs: 30_000 });
  await until('two waiters', () => gov.state(1).queued === 2, 30_000, 2);
  gov.configure([pool(1, { maxConcurrent: 2 }), pool(2)], []);
  t.match(await w.reply((r) => r.id === 1), { ok: true }, 'the raised limit admitted the oldest waiter');
  gov.configure([pool(2)], []);
  t.match(await w.reply((r) => r.id === 2), { ok: false, reason: 'unavailable' }, 'the removed pool refused the other');
  w.send({ cmd: 'acquire', id: 3, poolId: 2, waitMs: 0 });
  t.match(await w.reply((r) => r.id === 3), { ok: true }, 'a pool added later is known to the worker');
  w.send({ cmd: 'release', id: 1 });
  w.send({ cmd: 'release', id: 3 });
  await w.reply((r) => r.released === 3);
  if (held.ok) held.permit.release();
  t.same(gov.state(1), { inFlight: 0, queued: 0, effectiveLimit: 0, remaining: 0 }, 'the removed pool drained');
  t.equal(gov.state(2).inFlight, 0);
});

t.test("learning is shared: workers' rate headers set the main thread's RPM and their 429s lower the one adaptive limit", async (t) => {
  const gov = new SharedMemoryGovernor();
  t.teardown(() => gov.close());
  gov.configure([pool(1, { maxConcurrent: 20, adaptive: true }), pool(2, { maxConcurrent: 5 })], []);
  const [a, b] = await Promise.all([driven(gov, t), driven(gov, t)]);
  t.equal(gov.state(1).effectiveLimit, 20);
  // Worker A: an answer stating 600 requests per minute.
  a!.send({ cmd: 'acquire', id: 1, poolId: 2, waitMs: 0 });
  await a!.reply((r) => r.id === 1);
  a!.send({ cmd: 'release', id: 1, outcome: { status: 200, latencyMs: 5, headers: { 'x-ratelimit-limit-requests': '600' } } });
  await a!.reply((r) => r.released === 1);
  t.equal(gov.learned(2)!.learnedRpm, 600, "the main thread sees the RPM worker A's answer stated");
  // Worker B: a 429 with a retry hint backs the adaptive limit off for every thread.
  b!.send({ cmd: 'acquire', id: 2, poolId: 1, waitMs: 0 });
  await b!.reply((r) => r.id === 2);
  b!.send({ cmd: 'release', id: 2, outcome: { status: 429, latencyMs: 5 } });
  await b!.reply((r) => r.released === 2);
  t.equal(gov.state(1).effectiveLimit, 18, 'the adaptive limit backed off by 0.9 (20 → 18) in the one shared controller');
  a!.send({ cmd: 'state', poolId: 1 });
  t.match(await a!.reply((r) => r.state !== undefined), { state: { inFlight: 0 } });
  t.equal(gov.learned(1)!.adaptiveLimit, 18);
});

t.test('RPM gate shared: a fixed rate is one bucket for all threads', async (t) => {
  const gov = new SharedMemoryGovernor();
  t.teardown(() => gov.close());
  // 60 per minute: a bucket of one request, one more per second.
  gov.configure([pool(1, { maxConcurrent: 100, rpmOverride: 60 })], []);
  const ws = await Promise.all([1, 2, 3].map(() => driven(gov, t)));
  const started = Date.now();
  let admitted = 0;
  let limited = 0;
  for (let round = 0; round < 5; round++) {
    if (round > 0) await sleep(400);
    for (const [i, w] of ws.entries()) w.send({ cmd: 'acquire', id: round * 10 + i, poolId: 1, waitMs: 0 });
    for (const [i, w] of ws.entries()) {
      const r = await w.reply((m) => m.id === round * 10 + i);
      if (r.ok) {
        admitted++;
        w.send({ cmd: 'release', id: round * 10 + i });
      } else if (r.reason === 'rate_limited') limited++;
    }
  }
  const elapsedS = (Date.now() - started) / 1000;
  t.ok(admitted >= 2, `the bucket's request and at least one refill went (${admitted} admitted)`);
  t.ok(admitted <= 1 + Math.ceil(elapsedS) + 1, `no more than the bucket and its refill across 3 threads (${admitted} in ${elapsedS.toFixed(2)} s)`);
  t.equal(admitted + limited, 15, 'the rest were refused rate_limited');
});
