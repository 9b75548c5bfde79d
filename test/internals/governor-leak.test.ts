// White-box soak of the memory and shared-memory governors: 20,000 seeded random acquire/release/abort/timeout/reconfigure
// operations must end with zero in flight and zero waiters, with no negative count or over-admission on the way.
import t from 'tap';
import { abortableOf, type Admission, type BudgetLimits, type Permit, type PoolLimits } from '../../src/governor/governor.js';
import { SINGLE_PROCESS_GOVERNORS, pool, seeded } from '../helpers/governor-suite.js';

const OPS = 20_000;


for (const [kind, make] of SINGLE_PROCESS_GOVERNORS) {
  t.test(`${kind}: 20,000 random operations leave no slot and no waiter behind`, async (t) => {
    const rnd = seeded(0x5eed);
    const gov = make();
    t.teardown(() => gov.close());
    const budgets: BudgetLimits[] = [{ budgetId: 1, originMaxConcurrent: 6 }];
    const base: PoolLimits[] = [
      pool(1, { maxConcurrent: 3, queueLength: 5, budgetId: 1, reservedConcurrent: 2 }),
      pool(2, { maxConcurrent: 4, queueLength: 5, budgetId: 1, reservedConcurrent: 1 }),
      pool(3, { maxConcurrent: 2, queueLength: 3 }),
      pool(4, { maxConcurrent: 1, queueLength: 8 }),
    ];
    gov.configure(base, budgets);

    const held: Permit[] = [];
    const controllers: AbortController[] = [];
    let pending = 0;
    let admitted = 0;
    let released = 0;
    const outcomes = new Map<string, number>();
    const count = (k: string) => outcomes.set(k, (outcomes.get(k) ?? 0) + 1);
    const settle = (a: Admission) => {
      if (a.ok) {
        admitted++;
        held.push(a.permit);
        count('admitted');
      } else count(a.reason);
    };
    const invariant = (step: number) => {
      let budgetSum = 0;
      for (const p of base) {
        const s = gov.state(p.poolId);
        if (s.inFlight < 0 || s.queued < 0 || s.queued > p.queueLength) t.fail(`step ${step}: pool ${p.poolId} state ${JSON.stringify(s)}`);
        if (p.budgetId === 1) budgetSum += s.inFlight;
      }
      if (budgetSum > 6) t.fail(`step ${step}: budget over its cap (${budgetSum})`);
    };

    for (let step = 0; step < OPS; step++) {
      const r = rnd();
      if (r < 0.45) {
        const p = base[Math.floor(rnd() * base.length)]!;
        const ac = rnd() < 0.3 ? new AbortController() : null;
        if (ac) controllers.push(ac);
        const wait = rnd() < 0.25 ? 0 : 1 + Math.floor(rnd() * 15);
        const a = gov.acquire({ poolId: p.poolId, waitMs: wait, abortable: ac ? abortableOf(ac.signal) : undefined });
        if (a instanceof Promise) {
          pending++;
          void a.then((res) => {
            pending--;
            settle(res);
          });
        } else settle(a);
      } else if (r < 0.85) {
        if (held.length > 0) {
          const p = held.splice(Math.floor(rnd() * held.length), 1)[0]!;
          p.release({ status: 200 });
          released++;
          if (rnd() < 0.1) p.release(); // a second release must change nothing
        }
      } else if (r < 0.97) {
        if (controllers.length > 0) controllers.splice(Math.floor(rnd() * controllers.length), 1)[0]!.abort();
      } else {
        // Live reconfiguration: shrink or grow limits, or drop pool 4 for a while.
        const scale = rnd() < 0.5 ? 1 : 2;
        const pools = base.map((p) => ({ ...p, maxConcurrent: p.maxConcurrent * scale }));
        gov.configure(rnd() < 0.2 ? pools.filter((p) => p.poolId !== 4) : pools, budgets);
      }
      invariant(step);
      if (step % 200 === 0) await new Promise((r) => setTimeout(r, 1));
    }

    gov.configure(base, budgets);
    // Drain: release whatever is held until every waiter has an answer.
    while (held.length > 0 || pending > 0) {
      for (const p of held.splice(0)) {
        p.release();
        released++;
      }
      await new Promise((r) => setTimeout(r, 2));
    }
    for (const p of base) t.same(gov.state(p.poolId), { ...gov.state(p.poolId), inFlight: 0, queued: 0 }, `pool ${p.poolId} ends empty`);
    t.equal(released, admitted, 'every admission was released once');
    for (const reason of ['admitted', 'no_slot', 'queue_full', 'queue_timeout', 'aborted']) {
      t.ok((outcomes.get(reason) ?? 0) > 0, `exercised ${reason} (${outcomes.get(reason) ?? 0})`);
    }
  });
}
