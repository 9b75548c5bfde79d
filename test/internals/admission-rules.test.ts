// White-box tests of the admission rules written once (src/governor/admission-rules.ts) over a small
// in-test store, and of the memory and shared-memory governors driven by an injected clock: exact times,
// no sleeping (issue 19 §1: one core over a slot-state interface; clock and random source passed in).
import t from 'tap';
import * as rules from '../../src/governor/admission-rules.js';
import type { SlotState } from '../../src/governor/admission-rules.js';
import { BudgetShare } from '../../src/governor/budget-share.js';
import type { Admission } from '../../src/governor/governor.js';
import { RpmLearner } from '../../src/governor/rpm-learner.js';
import { SINGLE_PROCESS_GOVERNORS, pool } from '../helpers/governor-suite.js';
import { SimClock } from '../helpers/adaptive-sim.js';

/** A store kept in plain fields: what the rules need and nothing else. */
class TestSlots implements SlotState {
  inFlight = 0;
  reservedConcurrent = 0;
  queueLength = 2;
  queueTimeoutMs = 10_000;
  avgHoldMs = 0;
  budget: BudgetShare<TestSlots> | null = null;
  active = true;
  limit = 1;
  readonly rpm = new RpmLearner();
  /** Arrival numbers of the waiters, oldest first. */
  readonly waiters: number[] = [];
  readonly granted: number[] = [];
  gateTimer: unknown = null;
  opened = 0;
  constructor(readonly timers: SimClock) {}
  get queued(): number {
    return this.waiters.length;
  }
  effectiveLimit(): number {
    return this.active ? this.limit : 0;
  }
  rpmAllows(now: number): boolean {
    return this.rpm.allows(now);
  }
  rpmWaitMs(now: number): number {
    return this.rpm.waitMs(now);
  }
  rpmTake(now: number): void {
    this.rpm.take(now);
  }
  headSeq(): number {
    return this.waiters[0]!;
  }
  grantHead(now: number): void {
    rules.take(this, now);
    this.granted.push(this.waiters.shift()!);
    if (this.budget) this.budget.waiting--;
  }
  gateOpened(): void {
    this.opened++;
  }
}

t.test('the decision order: take, then the RPM gate, then no_slot, then queue_full, else the wait', async (t) => {
  const clock = new SimClock();
  const s = new TestSlots(clock);
  t.equal(rules.decide(s, 5000, 0), rules.TAKE, 'a free slot and nobody waiting: take it');
  rules.take(s, 0);
  t.equal(s.inFlight, 1);
  t.equal(rules.decide(s, 5000, 0), 5000, 'full: wait as asked');
  t.equal(rules.decide(s, 60_000, 0), 10_000, "the wait is clamped to the pool's queue timeout");
  s.avgHoldMs = 2500;
  t.same(rules.decide(s, 0, 0), { ok: false, reason: 'no_slot', queuedMs: 0, retryAfterMs: 3000 }, 'no wait asked: no_slot, hint 2.5 s rounded up to whole seconds');
  s.waiters.push(1, 2);
  t.same(rules.decide(s, 5000, 0), { ok: false, reason: 'queue_full', queuedMs: 0, retryAfterMs: 8000 }, 'queue full: hint = hold × (waiters + 1) / limit');
  s.waiters.length = 0;
  s.limit = 2;
  s.waiters.push(1);
  t.equal(rules.decide(s, 5000, 0), 5000, 'a free slot but a waiter ahead: the newcomer queues behind it');
  s.waiters.length = 0;
  // A fixed rate of 60/min (one a second, a burst of one): the first goes, the next waits a second.
  s.rpm.setOverride(60, 0);
  t.equal(rules.decide(s, 5000, 0), rules.TAKE);
  rules.take(s, 0);
  s.limit = 3;
  t.equal(rules.decide(s, 5000, 0), 5000, 'the gate opens within the wait: wait for it');
  t.same(rules.decide(s, 500, 0), { ok: false, reason: 'rate_limited', queuedMs: 0, retryAfterMs: 1000 }, 'it does not: rate_limited at once');
  t.equal(rules.decide(s, 5000, 1000), rules.TAKE, 'a second later the gate lets one through');
});

t.test('give counts once, never below zero; the hold average moves by one tenth', async (t) => {
  const s = new TestSlots(new SimClock());
  rules.take(s, 0);
  t.equal(rules.give(s), true);
  t.equal(rules.give(s), false, 'nothing held: nothing given');
  t.equal(s.inFlight, 0);
  rules.noteHold(s, 1000);
  t.equal(s.avgHoldMs, 1000, 'the first hold time is the average');
  rules.noteHold(s, 2000);
  t.equal(s.avgHoldMs, 1100);
});

t.test("a budget's hand-over: the oldest waiter across its pools whose pool may take a slot", async (t) => {
  const clock = new SimClock();
  const a = new TestSlots(clock);
  const b = new TestSlots(clock);
  a.limit = b.limit = 5;
  const share = new BudgetShare<TestSlots>(1, 2);
  share.members.push(a, b);
  a.budget = b.budget = share;
  a.waiters.push(3, 4);
  b.waiters.push(1, 2);
  share.recount((m) => m.queued);
  t.equal(share.waiting, 4);
  rules.pump(a, () => 0);
  t.same([b.granted, a.granted], [[1, 2], []], "oldest first across pools, until the budget's cap of 2");
  t.equal(share.inFlight, 2);
  t.equal(rules.remaining(a, 0), 0, 'the budget has no headroom left');
  rules.give(b);
  rules.pump(b, () => 0);
  t.same(a.granted, [3], 'a freed slot goes to the oldest waiter of the budget, in the other pool');
});

t.test("the RPM gate's wake-up is armed for the exact wait, once, and only while someone waits", async (t) => {
  const clock = new SimClock();
  const s = new TestSlots(clock);
  s.limit = 5;
  s.rpm.setOverride(60, 0);
  rules.take(s, 0);
  rules.armGate(s, 0);
  t.equal(s.gateTimer, null, 'nobody waits: no timer');
  s.waiters.push(1);
  clock.now = 250;
  rules.armGate(s, 250);
  const first = s.gateTimer;
  t.not(first, null);
  rules.armGate(s, 300);
  t.equal(s.gateTimer, first, 'armed once');
  await clock.run(999, async () => {});
  t.equal(s.opened, 0, 'not before the gate opens (750 ms after 250)');
  await clock.run(1000, async () => {});
  t.equal(s.opened, 1, 'at 1000 ms exactly');
  t.equal(s.gateTimer, null);
  s.active = false;
  rules.armGate(s, 1000);
  t.equal(s.gateTimer, null, 'a pool that left the configuration needs no wake-up');
});

for (const [kind, make] of SINGLE_PROCESS_GOVERNORS) {
  t.test(`${kind}: on an injected clock, waits and hints are exact`, async (t) => {
    const clock = new SimClock();
    const gov = make({ now: () => clock.now, timers: clock, wallClock: () => 1_700_000_000_000 + clock.now });
    t.teardown(() => gov.close());
    gov.configure([pool(1, { maxConcurrent: 1, queueLength: 4, queueTimeoutMs: 60_000 })], []);
    const settle = async (): Promise<void> => {
      for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
    };
    const first = gov.acquire({ poolId: 1, waitMs: 0 }) as Admission;
    if (!first.ok) throw new Error(first.reason);
    await clock.run(4000, settle);
    first.permit.release();
    t.equal(gov.state(1).inFlight, 0);
    const second = gov.acquire({ poolId: 1, waitMs: 0 }) as Admission;
    if (!second.ok) throw new Error(second.reason);
    t.same(gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot', queuedMs: 0, retryAfterMs: 4000 }, 'held 4 s once: the hint is 4 s');
    let answer: Admission | null = null;
    void (gov.acquire({ poolId: 1, waitMs: 2500 }) as Promise<Admission>).then((a) => (answer = a));
    t.equal(gov.state(1).queued, 1);
    await clock.run(6499, settle);
    t.equal(answer, null, 'still waiting 1 ms before its wait ends');
    await clock.run(6500, settle);
    t.same(answer, { ok: false, reason: 'queue_timeout', queuedMs: 2500, retryAfterMs: 4000, queued: true }, 'refused at 2500 ms exactly');
    let granted: Admission | null = null;
    void (gov.acquire({ poolId: 1, waitMs: 10_000 }) as Promise<Admission>).then((a) => (granted = a));
    await clock.run(7000, settle);
    second.permit.release();
    await settle();
    t.match(granted, { ok: true, queuedMs: 500, queued: true }, 'a release hands the slot to the waiter: queued 500 ms');
    (granted as unknown as { permit: { release(): void } }).permit.release();
    t.equal(gov.state(1).inFlight, 0);
  });
}
