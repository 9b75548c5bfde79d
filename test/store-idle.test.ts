// An idle service on the embedded store runs no statement (issue 29's tail): every statement on PGlite runs on the
// event loop that serves pool traffic, and an idle poolgate used to run four a second (the job runner's scan and
// sweep, the webhook deliverer's probe) and a full snapshot reload every resync period. The runner and the
// deliverer now sleep until the store's next due moment, and the embedded store's change feed cannot lose a
// notification, so the resync has nothing to catch up on. On PostgreSQL (shared by other processes, whose work
// arrives unannounced) they keep looking once a second.
import t from 'tap';
import { startTestService, type TestService } from './helpers/service.js';
import { sleep, until } from './helpers/until.js';
import { needServer } from './helpers/servers.js';
import type { Sql } from '../src/store/sql.js';

let svc: TestService;
let token: string;

t.before(async () => {
  // The shortest resync period there is: a reload every second, before.
  svc = await startTestService({ overrides: { snapshotResyncMs: 1000, accessLogFile: '/dev/null' } });
  ({ token } = await svc.bootstrap());
});
t.teardown(async () => {
  await svc?.close();
});

/** Counts every statement and transaction the service's parts run on `sql` (they all hold this object). */
function countStatements(sql: Sql): { seen: string[]; stop(): void } {
  const seen: string[] = [];
  const { query, transaction } = sql;
  const s = sql as { -readonly [K in keyof Sql]: Sql[K] };
  s.query = ((text: string, params?: readonly unknown[]) => {
    seen.push(text.replace(/\s+/g, ' '));
    return query(text, params as never);
  }) as Sql['query'];
  s.transaction = ((fn) => {
    seen.push('transaction');
    return transaction(fn);
  }) as Sql['transaction'];
  return {
    seen,
    stop() {
      s.query = query;
      s.transaction = transaction;
    },
  };
}

t.test('an idle service on the embedded store runs no statement', async (t) => {
  const snapshots = svc.service.dataplane!.snapshots;
  // Start-up's own looks (the runner's first sweep, the deliverer's first probe) are over.
  await until('the first snapshot', () => snapshots.fullLoads >= 1);
  await sleep(1500);
  const loads = snapshots.fullLoads;
  const counter = countStatements(svc.service.sql);
  try {
    // Three of the old poll periods (1 s) and of the resync period.
    await sleep(3500);
  } finally {
    counter.stop();
  }
  t.same(counter.seen, [], 'no statement while idle');
  t.equal(snapshots.fullLoads, loads, 'no periodic full reload');
});

t.test('a change still reaches the snapshot through the feed', async (t) => {
  const snapshots = svc.service.dataplane!.snapshots;
  const loads = snapshots.fullLoads;
  const created = await svc.api('POST', '/api/v1/pools', { token, body: { origin: 'https://api.example.com' } });
  t.equal(created.status, 201);
  const subdomain: string = created.body.data.subdomain;
  await until('the new pool in the snapshot', () => snapshots.current.pools.has(subdomain));
  t.ok(snapshots.fullLoads > loads, 'reloaded on the notification');
});

t.test('on PostgreSQL the runner and the deliverer keep looking once a second', { skip: await needServer('postgres') }, async (t) => {
  const pg = await startTestService({ engine: 'postgres', overrides: { accessLogFile: '/dev/null' } });
  t.teardown(() => pg.close());
  await sleep(1500);
  const counter = countStatements(pg.service.sql);
  try {
    await sleep(3000);
  } finally {
    counter.stop();
  }
  const jobs = counter.seen.filter((q) => q.includes('FROM jobs')).length;
  const deliveries = counter.seen.filter((q) => q.includes('webhook_deliveries')).length;
  // Each looks about once a second: 3 looks in 3 s, give or take a look at the edges and a slow machine; never
  // the once-a-millisecond of a missing period.
  t.ok(jobs >= 2 && jobs <= 14, `job runner: ${jobs} statements in 3 s (two a look)`);
  t.ok(deliveries >= 2 && deliveries <= 10, `webhook deliverer: ${deliveries} looks in 3 s`);
});
