// Request deadlines on one list per timeout length (src/dataplane/deadlines.ts): each node expires once, in start
// order, no earlier than its timeout; a node taken out never expires; one slow node at the head does not hold
// back the expiry of the others, nor does a removed head delay its successor. Time is driven (DrivenGovernorTime):
// each check is at an exact instant, whatever the machine's load.
import t from 'tap';
import { Deadlines, type DeadlineNode } from '../src/dataplane/deadlines.js';
import { DrivenGovernorTime } from './helpers/test-clock.js';

class Node implements DeadlineNode {
  deadlinePrev: DeadlineNode | null = null;
  deadlineNext: DeadlineNode | null = null;
  deadlineAt = NaN;
  firedAt: number | null = null;
  fires = 0;
  readonly started: number;
  constructor(
    readonly time: DrivenGovernorTime,
    readonly log: Node[],
  ) {
    this.started = time.now();
  }
  onDeadline(): void {
    this.fires++;
    this.firedAt = this.time.now();
    this.log.push(this);
  }
}

t.test('nodes expire once, in order, at their timeout and not before; removed ones never', async (t) => {
  const time = new DrivenGovernorTime();
  const d = new Deadlines(time);
  const log: Node[] = [];
  const made: Node[] = [];
  const lists = [];
  for (let i = 0; i < 5; i++) {
    const n = new Node(time, log);
    made.push(n);
    lists.push(d.add(n, 40));
    time.advance(5);
  }
  // The head and one in the middle finish first.
  lists[0]!.remove(made[0]!);
  lists[2]!.remove(made[2]!);
  lists[2]!.remove(made[2]!); // twice is harmless
  time.advance(40 - 5 * 5 + 5 - 1); // 1 ms before the second node's deadline
  t.same(log, [], 'nothing before its timeout');
  time.advance(1);
  t.same(log.map((n) => made.indexOf(n)), [1], 'the second at its deadline (the removed head did not delay it)');
  time.advance(100);
  t.same(log.map((n) => made.indexOf(n)), [1, 3, 4], 'the others expired, in start order');
  for (const n of log) {
    t.equal(n.fires, 1, 'once');
    t.equal(n.firedAt! - n.started, 40, 'at its timeout');
  }
  t.equal(made[0]!.fires + made[2]!.fires, 0, 'removed nodes never expire');
  t.equal(time.pending, 0, 'no timer left armed once the list is empty');
});

t.test('lengths have their own lists: a long timeout at the head of nothing holds a short one back', async (t) => {
  const time = new DrivenGovernorTime();
  const d = new Deadlines(time);
  const log: Node[] = [];
  const long = new Node(time, log);
  const longList = d.add(long, 10_000);
  const short = new Node(time, log);
  d.add(short, 30);
  time.advance(30);
  t.same(log, [short], 'the short one expired while the long one waits');
  longList.remove(long);
  time.advance(10_000);
  t.same(log, [short], 'the long one, removed, never expires');
});

t.test('a node added after the list emptied gets a timer again', async (t) => {
  const time = new DrivenGovernorTime();
  const d = new Deadlines(time);
  const log: Node[] = [];
  const a = new Node(time, log);
  d.add(a, 20);
  time.advance(60);
  t.same(log, [a]);
  t.equal(time.pending, 0, 'the emptied list holds no timer');
  const b = new Node(time, log);
  d.add(b, 20);
  time.advance(19);
  t.same(log, [a], 'not before its timeout');
  time.advance(1);
  t.same(log, [a, b]);
});

t.test('on the system clock, a node expires no earlier than its timeout', async (t) => {
  const d = new Deadlines();
  // The list's timer is unref'd (an idle list keeps no process alive): this one keeps the test's process up.
  const keepAlive = setTimeout(() => {}, 10_000);
  const fired = await new Promise<number>((resolve) => {
    const started = performance.now();
    const node: DeadlineNode = { deadlinePrev: null, deadlineNext: null, deadlineAt: NaN, onDeadline: () => resolve(performance.now() - started) };
    d.add(node, 15);
  });
  clearTimeout(keepAlive);
  t.ok(fired >= 15 - 1, `fired after ${fired.toFixed(1)} ms`);
});
