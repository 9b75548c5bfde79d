// The Governor contract against the shared-memory governor on the main thread and through an attached
// instance, plus what only it has: hand-overs that race a wait's end, fixed capacities. (What it shares
// with the memory governor beyond the contract is tested for both in governor.test.ts.)
import t from 'tap';
import { abortableOf } from '../src/governor/governor.js';
import { SharedMemoryGovernor } from '../src/governor/shared-memory.js';
import { C_LOCK, C_OWNER, SharedLayout } from '../src/governor/shared-memory-layout.js';
import { governorSuite, pool } from './helpers/governor-suite.js';

t.test('shared-memory governor: the Governor contract', async (t) => {
  governorSuite(t, () => new SharedMemoryGovernor({ sizes: { maxPools: 64, maxWaiters: 1024, maxThreads: 4 } }));
});

t.test('shared-memory governor, attached in the same thread: the Governor contract', async (t) => {
  // A second instance over the same buffer acquires; the main instance configures (the worker's configure is a no-op).
  governorSuite(t, () => {
    const main = new SharedMemoryGovernor({ sizes: { maxPools: 64, maxWaiters: 1024, maxThreads: 4 } });
    const worker = SharedMemoryGovernor.attach(main.handle());
    return {
      configure: (pools, budgets) => main.configure(pools, budgets),
      acquire: (req) => worker.acquire(req),
      state: (id) => worker.state(id),
      close: async () => {
        await main.close();
        await worker.close();
      },
    };
  });
});

t.test('shared: a waiter whose slot was handed over before its abort or timeout ran takes the slot (none is lost)', async (t) => {
  // The waiter waits in a second instance (thread slot 1) in this thread: the hand-over rings that slot's
  // doorbell, which is only heard on a later turn of the event loop, so the abort runs first.
  const main = new SharedMemoryGovernor();
  const other = SharedMemoryGovernor.attach(main.handle());
  t.teardown(async () => {
    await other.close();
    await main.close();
  });
  main.configure([pool(1)], []);
  const held = main.acquire({ poolId: 1, waitMs: 0 });
  if (held instanceof Promise || !held.ok) throw new Error('expected the slot');
  const ac = new AbortController();
  const w = other.acquire({ poolId: 1, waitMs: 5_000, abortable: abortableOf(ac.signal) });
  const next = other.acquire({ poolId: 1, waitMs: 5_000 });
  held.permit.release();
  t.same(main.state(1), { inFlight: 1, queued: 1, effectiveLimit: 1, remaining: 0 }, 'the slot is counted for the waiter');
  ac.abort();
  const got = await w;
  t.ok(got.ok, 'the waiter got the slot handed to it, as the memory governor would have granted it before the abort');
  if (got.ok) got.permit.release();
  const n = await next;
  t.ok(n.ok, 'its release went on to the next waiter');
  if (n.ok) n.permit.release();
  t.same(main.state(1), { inFlight: 0, queued: 0, effectiveLimit: 1, remaining: 1 });
});

t.test('shared: pools beyond maxPools are unavailable; waiters beyond maxWaiters are refused queue_full', async (t) => {
  const gov = new SharedMemoryGovernor({ sizes: { maxPools: 2, maxWaiters: 2, maxThreads: 2 } });
  t.teardown(() => gov.close());
  gov.configure([pool(1, { queueLength: 10 }), pool(2), pool(3)], []);
  t.match(gov.acquire({ poolId: 3, waitMs: 0 }), { ok: false, reason: 'unavailable' }, 'the third pool has no row');
  const held = gov.acquire({ poolId: 1, waitMs: 0 });
  const w = [gov.acquire({ poolId: 1, waitMs: 5_000 }), gov.acquire({ poolId: 1, waitMs: 5_000 })];
  t.match(gov.acquire({ poolId: 1, waitMs: 5_000 }), { ok: false, reason: 'queue_full' }, 'the entry table is full');
  if (!(held instanceof Promise) && held.ok) held.permit.release();
  for (const p of w) {
    const a = await p;
    if (a.ok) a.permit.release();
  }
  // Removing a pool frees its row for another once its permits drained.
  gov.configure([pool(1), pool(3)], []);
  const c = gov.acquire({ poolId: 3, waitMs: 0 });
  t.match(c, { ok: true }, 'the freed row serves pool 3');
  if (!(c instanceof Promise) && c.ok) c.permit.release();
  t.throws(() => gov.handle() && gov.handle(), /no free thread slot/, 'maxThreads bounds the handles');
});

t.test('shared: reclaim frees the lock a terminated worker held, and its slots', async (t) => {
  const main = new SharedMemoryGovernor({ sizes: { maxPools: 8, maxWaiters: 8, maxThreads: 4 } });
  t.teardown(() => main.close());
  main.configure([pool(1, { maxConcurrent: 2 })], []);
  const handle = main.handle();
  const worker = SharedMemoryGovernor.attach(handle);
  t.match(worker.acquire({ poolId: 1, waitMs: 0 }), { ok: true });
  // What worker.terminate() can leave behind: the worker stopped between taking the lock and letting it go.
  const l = new SharedLayout(handle.sizes, handle.buffer);
  Atomics.store(l.ctl, C_LOCK, 1);
  l.ctl[C_OWNER] = handle.thread + 1;
  main.reclaim(handle);
  t.same(main.state(1), { inFlight: 0, queued: 0, effectiveLimit: 2, remaining: 2 }, 'the lock is free and the slot came back');
  t.match(main.acquire({ poolId: 1, waitMs: 0 }), { ok: true });
});
