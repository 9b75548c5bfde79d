// Request deadlines on one list per timeout length (src/dataplane/deadlines.ts): each node expires once, in start
// order, no earlier than its timeout; a node taken out never expires; one slow node at the head does not hold
// back the expiry of the others, nor does a removed head delay its successor.
import t from 'tap';
import { Deadlines, type DeadlineNode } from '../src/dataplane/deadlines.js';

class Node implements DeadlineNode {
  deadlinePrev: DeadlineNode | null = null;
  deadlineNext: DeadlineNode | null = null;
  deadlineAt = NaN;
  firedAt: number | null = null;
  fires = 0;
  constructor(readonly started: number, readonly log: Node[]) {}
  onDeadline(): void {
    this.fires++;
    this.firedAt = performance.now();
    this.log.push(this);
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('nodes expire once, in order, no earlier than their timeout; removed ones never', async (t) => {
  const d = new Deadlines();
  const log: Node[] = [];
  const made: Node[] = [];
  const lists = [];
  for (let i = 0; i < 5; i++) {
    const n = new Node(performance.now(), log);
    made.push(n);
    lists.push(d.add(n, 40));
    await sleep(5);
  }
  // The head and one in the middle finish first.
  lists[0]!.remove(made[0]!);
  lists[2]!.remove(made[2]!);
  lists[2]!.remove(made[2]!); // twice is harmless
  await sleep(120);
  t.same(log.map((n) => made.indexOf(n)), [1, 3, 4], 'the others expired, in start order');
  for (const n of log) {
    t.equal(n.fires, 1, 'once');
    t.ok(n.firedAt! - n.started >= 40 - 1, `not before its timeout (${(n.firedAt! - n.started).toFixed(1)} ms)`);
  }
  t.equal(made[0]!.fires + made[2]!.fires, 0, 'removed nodes never expire');
});

t.test('lengths have their own lists: a long timeout at the head of nothing holds a short one back', async (t) => {
  const d = new Deadlines();
  const log: Node[] = [];
  const long = new Node(performance.now(), log);
  const longList = d.add(long, 10_000);
  const short = new Node(performance.now(), log);
  d.add(short, 30);
  await sleep(80);
  t.same(log, [short], 'the short one expired while the long one waits');
  longList.remove(long);
});

t.test('a node added after the list emptied gets a timer again', async (t) => {
  const d = new Deadlines();
  const log: Node[] = [];
  const a = new Node(performance.now(), log);
  d.add(a, 20);
  await sleep(60);
  const b = new Node(performance.now(), log);
  d.add(b, 20);
  await sleep(60);
  t.same(log, [a, b]);
});
