// The request path's metric children count in plain numbers; a scrape must show exactly what prom-client's
// own Counter and Histogram would: each count once, cumulative buckets with +Inf, _sum and _count.
import t from 'tap';
import { Counter, Histogram, Registry } from 'prom-client';
import { LocalCounter, LocalHistogram } from '../src/metrics/local-children.js';

const BUCKETS = [0.005, 0.01, 0.1, 1];
const VALUES = [0.001, 0.005, 0.007, 0.05, 0.5, 2, 30];

/** The series lines of one metric family, sorted (label order within a line as the registry prints it). */
async function series(reg: Registry, prefix: string): Promise<string[]> {
  return (await reg.metrics())
    .split('\n')
    .filter((l) => l.startsWith(prefix))
    .sort();
}

t.test('a local histogram scrapes exactly as a prom-client Histogram fed the same observations', async (t) => {
  const local = new Registry();
  const h = new LocalHistogram({ name: 'x_seconds', help: 'h', labelNames: ['pool'], buckets: BUCKETS, registry: local });
  const a = h.child({ pool: 'a' });
  h.child({ pool: 'unused' });
  for (const v of VALUES) a.observe(v);
  a.observe(Number.NaN);

  const reference = new Registry();
  const ref = new Histogram({ name: 'x_seconds', help: 'h', labelNames: ['pool'], buckets: BUCKETS, registers: [reference] });
  for (const v of VALUES) ref.observe({ pool: 'a' }, v);

  t.same(await series(local, 'x_seconds'), await series(reference, 'x_seconds'));
  t.match((await local.metrics()).split('\n'), ['# HELP x_seconds h', '# TYPE x_seconds histogram'], 'help and type lines');
  t.notOk((await local.metrics()).includes('unused'), 'a child with no observation has no series yet');

  h.remove({ pool: 'a' });
  t.same(await series(local, 'x_seconds'), [], 'removed with its pool');
});

t.test('local counters add their counts at each scrape, once', async (t) => {
  const reg = new Registry();
  const c = new LocalCounter({ name: 'y_total', help: 'c', labelNames: ['pool', 'outcome'], registry: reg });
  const ok = c.child({ pool: 'a', outcome: 'ok' });
  t.equal(c.child({ outcome: 'ok', pool: 'a' }), ok, 'one child per label set, whatever the key order');
  ok.inc();
  ok.inc(2);
  t.same(await series(reg, 'y_total'), ['y_total{pool="a",outcome="ok"} 3']);
  t.same(await series(reg, 'y_total'), ['y_total{pool="a",outcome="ok"} 3'], 'a second scrape adds nothing new');
  ok.inc();
  t.same(await series(reg, 'y_total'), ['y_total{pool="a",outcome="ok"} 4']);
  t.ok(c.counter instanceof Counter);
  c.remove({ pool: 'a', outcome: 'ok' });
  ok.inc();
  t.same(await series(reg, 'y_total'), [], 'a removed label set stays gone');
});
