// The upstream pool's counting on its own: slots within max, waiters served in order, another holder's idle
// connection closed to make room, a slot freed only when the holder gives it back, resize.
import t from 'tap';
import { UpstreamPool, type IdleHolder } from '../src/db/upstream-pool.js';

/** A holder with `idle` idle connections; closing one gives its slot back at once, or when `later` runs. */
function holder(up: UpstreamPool, idle: number, deferred = false) {
  const pending: Array<() => void> = [];
  const h: IdleHolder & { idle: number; closed: number; finish(): void } = {
    idle,
    closed: 0,
    closeIdle() {
      if (h.idle === 0) return false;
      h.idle--;
      h.closed++;
      if (deferred) pending.push(() => up.give());
      else up.give();
      return true;
    },
    finish() {
      for (const f of pending.splice(0)) f();
    },
  };
  up.join(h);
  return h;
}

t.test('slots are taken up to max; a waiter gets the next slot freed', async (t) => {
  const up = new UpstreamPool(2, 1000);
  t.ok(up.tryTake());
  t.ok(up.tryTake());
  t.notOk(up.tryTake(), 'full at max');
  const got: string[] = [];
  up.want(() => (got.push('a'), true));
  up.want(() => (got.push('b'), true));
  t.ok(up.waiting);
  up.give();
  t.same(got, ['a'], 'the first waiter first');
  t.equal(up.open, 2);
  up.give();
  t.same(got, ['a', 'b']);
  t.notOk(up.waiting);
});

t.test("a waiter makes room by closing another holder's idle connection, its slot freed only once closed", async (t) => {
  const up = new UpstreamPool(1, 1000);
  const other = holder(up, 1, true);
  t.ok(up.tryTake(), "the other holder's connection");
  let served = false;
  up.want(() => (served = true));
  t.equal(other.closed, 1, 'its idle connection is closed');
  t.notOk(served, 'the slot is not reused while the server may still hold the session');
  t.equal(up.open, 1);
  other.finish();
  t.ok(served, 'served once it has closed');
  t.equal(up.open, 1, 'never above max');
});

t.test('a cancelled wait takes no slot; a waiter that no longer wants one passes it on', async (t) => {
  const up = new UpstreamPool(1, 1000);
  t.ok(up.tryTake());
  const cancel = up.want(() => t.fail('cancelled'));
  cancel();
  t.notOk(up.waiting);
  let second = false;
  up.want(() => false);
  up.want(() => (second = true));
  up.give();
  t.ok(second, 'the slot went on to the next waiter');
  t.equal(up.open, 1);
});

t.test('a larger max serves waiters at once', async (t) => {
  const up = new UpstreamPool(1, 1000);
  t.ok(up.tryTake());
  let served = false;
  up.want(() => (served = true));
  up.resize(2);
  t.ok(served);
  t.equal(up.open, 2);
});
