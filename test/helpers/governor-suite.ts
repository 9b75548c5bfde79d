// The Governor contract as tests: every implementation (memory, redis) runs this same suite through a factory.
import type { Test } from 'tap';
import { abortableOf, type Admission, type BudgetLimits, type Governor, type Permit, type PoolLimits } from '../../src/governor/governor.js';
import { MemoryGovernor, type MemoryGovernorOptions } from '../../src/governor/memory.js';
import { SharedMemoryGovernor } from '../../src/governor/shared-memory.js';

export type GovernorFactory = () => Governor | Promise<Governor>;

/** The single-process governors (same rules, one in this thread, one in shared memory), for tests that hold for both. */
export const SINGLE_PROCESS_GOVERNORS = [
  ['memory', (o: MemoryGovernorOptions = {}) => new MemoryGovernor(o)],
  ['shared-memory', (o: MemoryGovernorOptions = {}) => new SharedMemoryGovernor(o)],
] as const;

export function pool(poolId: number, over: Partial<PoolLimits> = {}): PoolLimits {
  return { poolId, maxConcurrent: 1, queueLength: 10, queueTimeoutMs: 10_000, budgetId: null, reservedConcurrent: 0, ...over };
}

/** Seeded PRNG (mulberry32) so a failing randomized run can be replayed. */
export function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function permitOf(t: Test, a: Admission): Permit {
  if (!a.ok) throw new Error(`expected an admission, got ${a.reason}`);
  t.ok(a.permit, 'admitted with a permit');
  return a.permit;
}

const tick = () => new Promise((r) => setImmediate(r));

export function governorSuite(t: Test, factory: GovernorFactory): void {
  const make = async (t: Test, pools: PoolLimits[], budgets: BudgetLimits[] = []) => {
    const gov = await factory();
    t.teardown(() => gov.close());
    gov.configure(pools, budgets);
    return gov;
  };

  t.test('a free slot admits at once; with none, waitMs 0 fails fast with no_slot and a retry hint', async (t) => {
    const gov = await make(t, [pool(1, { maxConcurrent: 2 })]);
    const a = await gov.acquire({ poolId: 1, waitMs: 0 });
    const b = await gov.acquire({ poolId: 1, waitMs: 0 });
    t.match(a, { ok: true, queuedMs: 0 });
    t.match(b, { ok: true, queuedMs: 0 });
    t.same(gov.state(1), { inFlight: 2, queued: 0, effectiveLimit: 2, remaining: 0 });
    const c = await gov.acquire({ poolId: 1, waitMs: 0 });
    t.match(c, { ok: false, reason: 'no_slot', queuedMs: 0 });
    t.ok(!c.ok && c.retryAfterMs !== undefined && c.retryAfterMs >= 1000, 'retryAfterMs is at least one second');
    permitOf(t, a).release();
    t.same(gov.state(1), { inFlight: 1, queued: 0, effectiveLimit: 2, remaining: 1 });
    permitOf(t, b).release();
  });

  t.test('an unknown pool is unavailable', async (t) => {
    const gov = await make(t, [pool(1)]);
    t.match(await gov.acquire({ poolId: 99, waitMs: 1000 }), { ok: false, reason: 'unavailable' });
  });

  t.test('waiters are admitted in arrival order, one per released slot', async (t) => {
    const gov = await make(t, [pool(1)]);
    const first = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const order: number[] = [];
    const waits = [1, 2, 3].map((n) =>
      Promise.resolve(gov.acquire({ poolId: 1, waitMs: 5000 })).then((a) => {
        order.push(n);
        return permitOf(t, a);
      }),
    );
    await tick();
    t.equal(gov.state(1).queued, 3);
    first.release();
    const p1 = await waits[0]!;
    t.same(order, [1]);
    t.same(gov.state(1), { inFlight: 1, queued: 2, effectiveLimit: 1, remaining: 0 });
    p1.release();
    const p2 = await waits[1]!;
    p2.release();
    const p3 = await waits[2]!;
    t.same(order, [1, 2, 3]);
    p3.release();
    t.same(gov.state(1), { inFlight: 0, queued: 0, effectiveLimit: 1, remaining: 1 });
  });

  t.test('the queue holds queueLength waiters; one more is refused with queue_full', async (t) => {
    const gov = await make(t, [pool(1, { queueLength: 2 })]);
    const held = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const w1 = gov.acquire({ poolId: 1, waitMs: 5000 });
    const w2 = gov.acquire({ poolId: 1, waitMs: 5000 });
    await tick();
    const full = await gov.acquire({ poolId: 1, waitMs: 5000 });
    t.match(full, { ok: false, reason: 'queue_full' });
    t.ok(!full.ok && full.retryAfterMs! >= 1000);
    t.equal(gov.state(1).queued, 2);
    held.release();
    permitOf(t, await w1).release();
    permitOf(t, await w2).release();
  });

  t.test('a waiter gives up with queue_timeout after waitMs and leaves the queue', async (t) => {
    const gov = await make(t, [pool(1)]);
    const held = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const started = Date.now();
    const r = await gov.acquire({ poolId: 1, waitMs: 40 });
    t.match(r, { ok: false, reason: 'queue_timeout' });
    t.ok(Date.now() - started >= 35, 'waited about waitMs');
    t.equal(gov.state(1).queued, 0);
    held.release();
    t.equal(gov.state(1).inFlight, 0, 'the timed-out waiter took no slot');
  });

  t.test('queued: false when answered at once (even when a wait was allowed), true when the caller sat in the queue', async (t) => {
    const gov = await make(t, [pool(1)]);
    const first = await gov.acquire({ poolId: 1, waitMs: 5000 });
    t.match(first, { ok: true, queued: false, queuedMs: 0 }, 'a free slot: not queued, though the caller would have waited');
    const waits = gov.acquire({ poolId: 1, waitMs: 5000 });
    const timesOut = await gov.acquire({ poolId: 1, waitMs: 150 });
    t.match(timesOut, { ok: false, reason: 'queue_timeout', queued: true }, 'refused after waiting: queued');
    const failsFast = await gov.acquire({ poolId: 1, waitMs: 0 });
    t.match(failsFast, { ok: false, reason: 'no_slot' });
    t.notOk(!failsFast.ok && failsFast.queued, 'a fail-fast refusal never queued');
    permitOf(t, first).release();
    const second = await waits;
    t.match(second, { ok: true, queued: true }, 'admitted after waiting for a release: queued');
    permitOf(t, second).release();
  });

  t.test("waitMs is clamped to the pool's queue timeout", async (t) => {
    const gov = await make(t, [pool(1, { queueTimeoutMs: 30 })]);
    const held = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const started = Date.now();
    t.match(await gov.acquire({ poolId: 1, waitMs: 60_000 }), { ok: false, reason: 'queue_timeout' });
    t.ok(Date.now() - started < 5000);
    held.release();
  });

  t.test('an aborted waiter leaves the queue; the next waiter gets the slot', async (t) => {
    const gov = await make(t, [pool(1)]);
    const held = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const ac = new AbortController();
    const gone = gov.acquire({ poolId: 1, waitMs: 5000, abortable: abortableOf(ac.signal) });
    const next = gov.acquire({ poolId: 1, waitMs: 5000 });
    await tick();
    t.equal(gov.state(1).queued, 2);
    ac.abort();
    t.match(await gone, { ok: false, reason: 'aborted' });
    t.equal(gov.state(1).queued, 1);
    held.release();
    const p = permitOf(t, await next);
    t.same(gov.state(1), { inFlight: 1, queued: 0, effectiveLimit: 1, remaining: 0 });
    p.release();
    const pre = new AbortController();
    pre.abort();
    t.match(await gov.acquire({ poolId: 1, waitMs: 5000, abortable: abortableOf(pre.signal) }), { ok: false, reason: 'aborted' }, 'an already aborted signal is refused');
    t.equal(gov.state(1).inFlight, 0);
  });

  t.test('a lazy abort signal is made only for a request that waits, and aborting it leaves the queue', async (t) => {
    const gov = await make(t, [pool(1)]);
    const lazy = () => {
      const ac = new AbortController();
      const l = { made: 0, abort: () => ac.abort(), get aborted() { return ac.signal.aborted; }, signal() { l.made++; return ac.signal; } };
      return l;
    };
    const first = lazy();
    const granted = gov.acquire({ poolId: 1, waitMs: 5000, abortable: first });
    // A governor that answers synchronously (memory, shared memory) grants a free slot without one.
    if (!(granted instanceof Promise)) t.equal(first.made, 0, 'granted at once: no signal made');
    const held = permitOf(t, await granted);
    const second = lazy();
    const gone = gov.acquire({ poolId: 1, waitMs: 5000, abortable: second });
    await tick();
    t.equal(gov.state(1).queued, 1);
    t.ok(second.made <= 1, 'at most one signal made for the wait');
    second.abort();
    t.match(await gone, { ok: false, reason: 'aborted' });
    t.equal(gov.state(1).queued, 0, 'the aborted waiter left the queue');
    held.release();
    const pre = lazy();
    pre.abort();
    t.match(await gov.acquire({ poolId: 1, waitMs: 5000, abortable: pre }), { ok: false, reason: 'aborted' }, 'an already aborted one is refused');
    t.equal(gov.state(1).inFlight, 0);
  });

  t.test('release is idempotent: a second call frees nothing', async (t) => {
    const gov = await make(t, [pool(1)]);
    const held = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const w1 = gov.acquire({ poolId: 1, waitMs: 5000 });
    const w2 = gov.acquire({ poolId: 1, waitMs: 5000 });
    await tick();
    held.release({ status: 200 });
    held.release({ status: 200 });
    const p1 = permitOf(t, await w1);
    await tick();
    t.same(gov.state(1), { inFlight: 1, queued: 1, effectiveLimit: 1, remaining: 0 }, 'only one waiter admitted');
    p1.release();
    p1.release();
    permitOf(t, await w2).release();
    held.release();
    t.equal(gov.state(1).inFlight, 0, 'never negative');
  });

  t.test('budget: each pool keeps its reserve; beyond it pools borrow only the unallocated slots', async (t) => {
    // max 6, A reserves 2, B reserves 1 → unallocated 3.
    const gov = await make(
      t,
      [pool(1, { maxConcurrent: 10, budgetId: 7, reservedConcurrent: 2 }), pool(2, { maxConcurrent: 10, budgetId: 7, reservedConcurrent: 1 }), pool(3, { maxConcurrent: 10, budgetId: 7 })],
      [{ budgetId: 7, originMaxConcurrent: 6 }],
    );
    const c = [];
    // Pool 3 (no reserve) borrows all 3 unallocated slots, then stops.
    for (let i = 0; i < 3; i++) c.push(permitOf(t, await gov.acquire({ poolId: 3, waitMs: 0 })));
    t.match(await gov.acquire({ poolId: 3, waitMs: 0 }), { ok: false, reason: 'no_slot' });
    t.equal(gov.state(3).remaining, 0);
    // A and B still get their reserves.
    t.equal(gov.state(1).remaining, 2);
    const a1 = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const a2 = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const b1 = permitOf(t, await gov.acquire({ poolId: 2, waitMs: 0 }));
    t.match(await gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' }, 'A cannot borrow: nothing unallocated left');
    t.match(await gov.acquire({ poolId: 2, waitMs: 0 }), { ok: false, reason: 'no_slot' });
    t.equal(gov.state(1).inFlight + gov.state(2).inFlight + gov.state(3).inFlight, 6);
    // A borrowed slot freed by pool 3 can be borrowed by A.
    c.pop()!.release();
    const a3 = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    t.match(await gov.acquire({ poolId: 3, waitMs: 0 }), { ok: false, reason: 'no_slot' });
    for (const p of [...c, a1, a2, a3, b1]) p.release();
    t.equal(gov.state(1).remaining, 5, 'reserve 2 + unallocated 3');
  });

  t.test('budget: a pool never exceeds its own maxConcurrent, even with budget room', async (t) => {
    const gov = await make(t, [pool(1, { maxConcurrent: 2, budgetId: 1 }), pool(2, { maxConcurrent: 5, budgetId: 1 })], [{ budgetId: 1, originMaxConcurrent: 10 }]);
    const held = [permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 })), permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }))];
    t.match(await gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' });
    t.equal(gov.state(2).remaining, 5);
    for (const p of held) p.release();
  });

  t.test("budget: a freed slot goes to the oldest waiter among the budget's pools", async (t) => {
    const gov = await make(t, [pool(1, { maxConcurrent: 5, budgetId: 1 }), pool(2, { maxConcurrent: 5, budgetId: 1 })], [{ budgetId: 1, originMaxConcurrent: 2 }]);
    const a1 = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const a2 = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const got: string[] = [];
    const wb = Promise.resolve(gov.acquire({ poolId: 2, waitMs: 5000 })).then((a) => (got.push('B'), permitOf(t, a)));
    await tick();
    const wa = Promise.resolve(gov.acquire({ poolId: 1, waitMs: 5000 })).then((a) => (got.push('A'), permitOf(t, a)));
    await tick();
    a1.release();
    const pb = await wb;
    await tick();
    t.same(got, ['B'], "pool 2's older waiter took pool 1's freed slot");
    a2.release();
    const pa = await wa;
    t.same(got, ['B', 'A']);
    pa.release();
    pb.release();
    t.equal(gov.state(1).inFlight + gov.state(2).inFlight, 0);
  });

  t.test('budget randomized: in-flight never exceeds the origin max, pool max, and reserves always admit', async (t) => {
    const rnd = seeded(20260101);
    const budgets: BudgetLimits[] = [
      { budgetId: 1, originMaxConcurrent: 10 },
      { budgetId: 2, originMaxConcurrent: 4 },
      { budgetId: 3, originMaxConcurrent: null },
    ];
    const pools: PoolLimits[] = [
      pool(1, { maxConcurrent: 6, budgetId: 1, reservedConcurrent: 3 }),
      pool(2, { maxConcurrent: 4, budgetId: 1, reservedConcurrent: 2 }),
      pool(3, { maxConcurrent: 8, budgetId: 1, reservedConcurrent: 0 }),
      pool(4, { maxConcurrent: 3, budgetId: 1, reservedConcurrent: 1 }),
      pool(5, { maxConcurrent: 4, budgetId: 2, reservedConcurrent: 2 }),
      pool(6, { maxConcurrent: 4, budgetId: 2, reservedConcurrent: 2 }),
      pool(7, { maxConcurrent: 3, budgetId: 3 }),
      pool(8, { maxConcurrent: 2 }),
    ];
    const gov = await make(t, pools, budgets);
    const held: Permit[] = [];
    const pending = new Set<Promise<unknown>>();
    // Acquires of each pool not yet answered. A fail-fast one is neither queued nor in flight in state() while
    // its round trip is out (the Redis governor), yet it is ahead of the next request and may take the slot.
    const unanswered = new Map<number, number>();
    const check = (step: number) => {
      for (const b of budgets) {
        if (b.originMaxConcurrent === null) continue;
        const sum = pools.filter((p) => p.budgetId === b.budgetId).reduce((s, p) => s + gov.state(p.poolId).inFlight, 0);
        if (sum > b.originMaxConcurrent) t.fail(`step ${step}: budget ${b.budgetId} has ${sum} in flight > ${b.originMaxConcurrent}`);
      }
      for (const p of pools) {
        const s = gov.state(p.poolId);
        if (s.inFlight > p.maxConcurrent || s.inFlight < 0) t.fail(`step ${step}: pool ${p.poolId} has ${s.inFlight} in flight`);
      }
    };
    let reserveChecks = 0;
    for (let step = 0; step < 3000; step++) {
      const r = rnd();
      if (r < 0.5) {
        const p = pools[Math.floor(rnd() * pools.length)]!;
        const s = gov.state(p.poolId);
        // Below its reserve and its own max, with nobody of its own ahead: the pool must be admitted.
        const ahead = s.queued + (unanswered.get(p.poolId) ?? 0);
        const mustAdmit = p.budgetId !== null && p.budgetId !== 3 && s.inFlight < p.reservedConcurrent && ahead === 0;
        const wait = rnd() < 0.3 ? 0 : 1 + Math.floor(rnd() * 20);
        const a = gov.acquire({ poolId: p.poolId, waitMs: wait });
        if (a instanceof Promise || wait > 0) {
          const answered = !(a instanceof Promise);
          if (!answered) unanswered.set(p.poolId, (unanswered.get(p.poolId) ?? 0) + 1);
          const pr = Promise.resolve(a).then((res) => {
            if (!answered) unanswered.set(p.poolId, unanswered.get(p.poolId)! - 1);
            if (res.ok) held.push(res.permit);
            pending.delete(pr);
          });
          pending.add(pr);
          if (mustAdmit) {
            const res = await a;
            reserveChecks++;
            if (!res.ok) t.fail(`step ${step}: pool ${p.poolId} below its reserve was refused (${res.reason})`);
          }
        } else {
          if (a.ok) held.push(a.permit);
          if (mustAdmit) {
            reserveChecks++;
            if (!a.ok) t.fail(`step ${step}: pool ${p.poolId} below its reserve was refused (${a.reason})`);
          }
        }
      } else if (held.length > 0) {
        held.splice(Math.floor(rnd() * held.length), 1)[0]!.release();
      }
      check(step);
      if (step % 50 === 0) await tick();
    }
    while (held.length > 0 || pending.size > 0) {
      for (const p of held.splice(0)) p.release();
      check(-1);
      await Promise.race([...pending, new Promise((r) => setTimeout(r, 5))]);
    }
    t.ok(reserveChecks > 50, `reserve guarantee exercised (${reserveChecks} times)`);
    for (const p of pools) t.same(gov.state(p.poolId).inFlight + gov.state(p.poolId).queued, 0, `pool ${p.poolId} drained`);
  });

  t.test('reconfigure down: in-flight finish, nothing new is admitted until below the new limit', async (t) => {
    const gov = await make(t, [pool(1, { maxConcurrent: 3 })]);
    const held = [];
    for (let i = 0; i < 3; i++) held.push(permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 })));
    gov.configure([pool(1, { maxConcurrent: 1 })], []);
    t.same(gov.state(1), { inFlight: 3, queued: 0, effectiveLimit: 1, remaining: 0 });
    t.match(await gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' });
    held.pop()!.release();
    held.pop()!.release();
    t.match(await gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' }, 'still at the new limit');
    held.pop()!.release();
    permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 })).release();
  });

  t.test('reconfigure up admits waiters at once', async (t) => {
    const gov = await make(t, [pool(1, { maxConcurrent: 1 })]);
    const held = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const w = [gov.acquire({ poolId: 1, waitMs: 5000 }), gov.acquire({ poolId: 1, waitMs: 5000 })];
    await tick();
    gov.configure([pool(1, { maxConcurrent: 3 })], []);
    const got = await Promise.all(w);
    t.ok(got.every((a) => a.ok));
    t.same(gov.state(1), { inFlight: 3, queued: 0, effectiveLimit: 3, remaining: 0 });
    for (const a of got) permitOf(t, a).release();
    held.release();
  });

  t.test('raising a budget cap admits waiters of its pools at once', async (t) => {
    const pools = [pool(1, { maxConcurrent: 5, budgetId: 1 }), pool(2, { maxConcurrent: 5, budgetId: 1 })];
    const gov = await make(t, pools, [{ budgetId: 1, originMaxConcurrent: 1 }]);
    const held = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const w = gov.acquire({ poolId: 2, waitMs: 5000 });
    await tick();
    t.equal(gov.state(2).queued, 1);
    gov.configure(pools, [{ budgetId: 1, originMaxConcurrent: 2 }]);
    permitOf(t, await w).release();
    held.release();
  });

  t.test('a pool removed from the config refuses new acquires and its waiters with unavailable', async (t) => {
    const gov = await make(t, [pool(1), pool(2)]);
    const held = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const w = gov.acquire({ poolId: 1, waitMs: 5000 });
    await tick();
    gov.configure([pool(2)], []);
    t.match(await w, { ok: false, reason: 'unavailable' });
    t.match(await gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'unavailable' });
    held.release();
    t.equal(gov.state(1).inFlight, 0);
    permitOf(t, await gov.acquire({ poolId: 2, waitMs: 0 })).release();
  });

  t.test('close refuses every waiter with unavailable', async (t) => {
    const gov = await factory();
    gov.configure([pool(1)], []);
    const held = permitOf(t, await gov.acquire({ poolId: 1, waitMs: 0 }));
    const w = gov.acquire({ poolId: 1, waitMs: 5000 });
    await tick();
    await gov.close();
    t.match(await w, { ok: false, reason: 'unavailable' });
    t.match(await gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'unavailable' });
    held.release();
  });
}
