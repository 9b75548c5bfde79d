// The Governor contract against the in-memory governor, plus what the single-process governors (memory and
// shared-memory) promise beyond it: synchronous answers on the hot path, a clock passed in.
import t from 'tap';
import { abortableOf } from '../src/governor/governor.js';
import { MemoryGovernor } from '../src/governor/memory.js';
import { SINGLE_PROCESS_GOVERNORS, governorSuite, pool } from './helpers/governor-suite.js';

t.test('memory governor: the Governor contract', async (t) => {
  governorSuite(t, () => new MemoryGovernor());
});


for (const [kind, make] of SINGLE_PROCESS_GOVERNORS) {
  t.test(`${kind}: a free slot and a fail-fast refusal are answered synchronously, not as promises`, async (t) => {
    const gov = make({});
    t.teardown(() => gov.close());
    gov.configure([pool(1)], []);
    const a = gov.acquire({ poolId: 1, waitMs: 1000 });
    t.notOk(a instanceof Promise, 'admission is synchronous');
    t.match(a, { ok: true, queuedMs: 0 });
    const b = gov.acquire({ poolId: 1, waitMs: 0 });
    t.notOk(b instanceof Promise, 'no_slot is synchronous');
    t.match(b, { ok: false, reason: 'no_slot' });
    t.match(gov.acquire({ poolId: 2, waitMs: 1000 }), { ok: false, reason: 'unavailable' }, 'unknown pool is synchronous');
    const waiting = gov.acquire({ poolId: 1, waitMs: 1000 });
    t.ok(waiting instanceof Promise, 'waiting for a slot is a promise');
    if (a.ok) a.permit.release();
    t.match(await waiting, { ok: true });
  });

  t.test(`${kind}: queuedMs and the retry hint come from the clock passed in`, async (t) => {
    let clock = 1_000;
    const gov = make({ now: () => clock });
    t.teardown(() => gov.close());
    gov.configure([pool(1, { maxConcurrent: 2 })], []);
    const grab = () => {
      const a = gov.acquire({ poolId: 1, waitMs: 0 });
      if (a instanceof Promise || !a.ok) throw new Error('expected a slot');
      return a.permit;
    };
    // Two permits each held 6 s: the average hold is 6 s; with 2 slots and nobody queued the hint is 3 s.
    let p1 = grab();
    let p2 = grab();
    clock += 6_000;
    p1.release();
    p2.release();
    p1 = grab();
    p2 = grab();
    t.match(gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot', retryAfterMs: 3_000 });
    const w = gov.acquire({ poolId: 1, waitMs: 5_000 });
    clock += 250;
    p1.release();
    t.match(await w, { ok: true, queuedMs: 250 });
    p2.release();
  });

  t.test(`${kind}: a waiter that timed out or aborted cannot be admitted later`, async (t) => {
    const gov = make({});
    t.teardown(() => gov.close());
    gov.configure([pool(1)], []);
    const held = gov.acquire({ poolId: 1, waitMs: 0 });
    const ac = new AbortController();
    const w = gov.acquire({ poolId: 1, waitMs: 5_000, abortable: abortableOf(ac.signal) });
    ac.abort();
    ac.abort();
    t.match(await w, { ok: false, reason: 'aborted' });
    if (!(held instanceof Promise) && held.ok) held.permit.release();
    t.same(gov.state(1), { inFlight: 0, queued: 0, effectiveLimit: 1, remaining: 1 });
  });
}
