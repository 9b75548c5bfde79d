// Per-minute pool rollups: counted in memory, written in one multi-row upsert per flush, kept on failure.
import t from 'tap';
import { openPglite } from '../src/store/pglite.js';
import { openPostgres } from '../src/store/postgres.js';
import { migrate } from '../src/store/migrate.js';
import type { Queryable, Sql, SqlParam } from '../src/store/sql.js';
import { RollupBuffer } from '../src/metrics/rollups.js';
import { minuteRollups } from '../src/store/metrics.js';
import { bucketOf, quantileMs } from '../src/domain/latency-buckets.js';
import { until } from './helpers/until.js';
import { freshPostgresDatabase } from './helpers/postgres-database.js';
import { needServer } from './helpers/servers.js';

const MINUTE = 60_000;
const T0 = Date.UTC(2026, 0, 1, 12, 0, 0);

/** The real store, counting statements and failing them on demand (a store outage). */
function watched(sql: Sql) {
  const w = {
    statements: 0,
    down: false,
    db: {
      query: async (text: string, params?: readonly SqlParam[]) => {
        if (w.down) throw new Error('connection refused');
        w.statements++;
        return sql.query(text, params);
      },
    } as Queryable,
  };
  return w;
}

async function rows(sql: Sql) {
  const { rows } = await sql.query<{ pool_id: number; minute: Date; requests: number; admitted: number; queued: number; rejected: number }>(
    `SELECT pool_id, minute, requests::int AS requests, admitted::int AS admitted, queued::int AS queued, rejected::int AS rejected
       FROM pool_metrics_minute ORDER BY pool_id, minute`,
  );
  return rows.map((r) => ({ ...r, minute: new Date(r.minute).getTime() - T0 }));
}

t.test('latency buckets: bounds and interpolated quantiles', async (t) => {
  t.equal(bucketOf(0), 0);
  t.equal(bucketOf(1), 0);
  t.equal(bucketOf(1.5), 1);
  t.equal(bucketOf(60_000), 14);
  t.equal(bucketOf(10_000_000), 15, 'above the last bound: the overflow bucket');
  t.equal(quantileMs(null, 0.5), null);
  t.equal(quantileMs(new Array(16).fill(0), 0.5), null, 'no observations: no percentile');
  const h = new Array(16).fill(0);
  h[6] = 10; // ten values in (50, 100]
  t.equal(quantileMs(h, 0.5), 75, 'interpolated inside the bucket');
  h[15] = 100;
  t.equal(quantileMs(h, 0.95), 60_000, 'the overflow bucket answers its lower bound');
});

function suite(engine: string, open: () => Promise<{ sql: Sql; done(): Promise<void> }>) {
  t.test(engine, async (t) => {
    const skip = engine === 'postgres' ? await needServer('postgres') : false;
    if (skip) return t.skip(skip);
    const { sql, done } = await open();
    t.teardown(done);
    await migrate(sql);
    const team = await sql.query<{ id: number }>(`INSERT INTO teams (name, slug) VALUES ('Acme', 'acme') RETURNING id`);
    const ids: number[] = [];
    for (const sub of ['alpha', 'beta']) {
      const r = await sql.query<{ id: number }>(`INSERT INTO pools (team_id, name, subdomain, backend) VALUES ($1, $2, $2, 'http') RETURNING id`, [team.rows[0]!.id, sub]);
      ids.push(r.rows[0]!.id);
    }
    const [alpha, beta] = ids as [number, number];
    let clock = T0 + 5_000;

    t.test('counts stay in memory until a flush writes them with one statement', async (t) => {
      await sql.query('DELETE FROM pool_metrics_minute');
      const w = watched(sql);
      const buf = new RollupBuffer({ db: w.db, flushEveryMs: 0, now: () => clock });
      for (let i = 0; i < 500; i++) {
        buf.add(alpha, 'requests');
        buf.add(alpha, i % 5 === 0 ? 'rejected' : 'admitted');
        if (i % 10 === 0) buf.add(alpha, 'queued');
      }
      buf.add(beta, 'requests', 3);
      clock += MINUTE; // the next minute gets its own row
      buf.add(alpha, 'requests');
      t.equal(w.statements, 0, 'no write per request');
      await buf.flush();
      t.equal(w.statements, 1, 'one upsert per flush');
      t.same(await rows(sql), [
        { pool_id: alpha, minute: 0, requests: 500, admitted: 400, queued: 50, rejected: 100 },
        { pool_id: alpha, minute: MINUTE, requests: 1, admitted: 0, queued: 0, rejected: 0 },
        { pool_id: beta, minute: 0, requests: 3, admitted: 0, queued: 0, rejected: 0 },
      ]);
      await buf.flush();
      t.equal(w.statements, 1, 'nothing counted: nothing written');
      buf.add(alpha, 'requests', 2);
      await buf.close();
      t.equal((await rows(sql))[1]!.requests, 3, 'a later flush adds to the stored minute');
    });

    t.test('a failed flush keeps its counts for the next try', async (t) => {
      await sql.query('DELETE FROM pool_metrics_minute');
      clock = T0 + 1_000;
      const w = watched(sql);
      const buf = new RollupBuffer({ db: w.db, flushEveryMs: 0, now: () => clock });
      buf.add(alpha, 'requests', 4);
      buf.add(alpha, 'admitted', 4);
      w.down = true;
      await t.rejects(buf.flush(), /connection refused/);
      t.equal(buf.pendingRows, 1);
      buf.add(alpha, 'requests'); // same minute, counted meanwhile
      clock += MINUTE;
      buf.add(alpha, 'requests');
      await t.rejects(buf.flush(), /connection refused/);
      t.equal(buf.pendingRows, 2, 'given-back rows are merged by pool and minute');
      buf.add(alpha, 'rejected');
      w.down = false;
      await buf.flush();
      t.same(await rows(sql), [
        { pool_id: alpha, minute: 0, requests: 5, admitted: 4, queued: 0, rejected: 0 },
        { pool_id: alpha, minute: MINUTE, requests: 1, admitted: 0, queued: 0, rejected: 1 },
      ]);
      await buf.close();
    });

    t.test('queue wait and upstream histograms add across flushes and failures; p50/p95 and the lowest effective limit come back', async (t) => {
      // Issue 17's charts: percentiles of a whole minute even when it was written by several partial flushes.
      await sql.query('DELETE FROM pool_metrics_minute');
      clock = T0 + 2_000;
      const w = watched(sql);
      let limit = 8;
      const buf = new RollupBuffer({ db: w.db, flushEveryMs: 0, now: () => clock, effectiveLimit: () => limit });
      const req = (queueWaitMs: number, upstreamMs: number | null, upstreamError = false) =>
        buf.addRequest(alpha, true, queueWaitMs > 0, false, { queueWaitMs, upstreamMs, upstreamError });
      for (let i = 0; i < 60; i++) req(0, 8); // 60 quick ones
      await buf.flush();
      limit = 5;
      for (let i = 0; i < 30; i++) req(0, 15);
      w.down = true;
      await t.rejects(buf.flush(), /connection refused/); // given back, merged with what comes next
      w.down = false;
      limit = 6;
      for (let i = 0; i < 10; i++) req(400, 3_000, i === 0); // 10 slow ones waited 400 ms
      await buf.flush();
      const [m, ...rest] = await minuteRollups(sql, alpha, new Date(T0));
      t.equal(rest.length, 0, 'one row for the minute');
      t.match(m, { requests: 100, admitted: 100, queued: 10, upstream_errors: 1, effective_limit: 5 });
      // 90 of 100 waited 0 ms (bucket <= 1 ms), 10 waited 400 ms (200–500): p50 in the first bucket, p95 in the 400s' bucket.
      t.ok(m!.queue_wait_p50_ms! <= 1, `queue wait p50 ${m!.queue_wait_p50_ms}`);
      t.ok(m!.queue_wait_p95_ms! > 200 && m!.queue_wait_p95_ms! <= 500, `queue wait p95 ${m!.queue_wait_p95_ms}`);
      // Upstream: 60 × 8 ms (5–10), 30 × 15 ms (10–20), 10 × 3 s (2000–5000).
      t.ok(m!.upstream_p50_ms! > 5 && m!.upstream_p50_ms! <= 10, `upstream p50 ${m!.upstream_p50_ms}`);
      t.ok(m!.upstream_p95_ms! > 2000 && m!.upstream_p95_ms! <= 5000, `upstream p95 ${m!.upstream_p95_ms}`);
      t.equal(w.statements, 2, 'still one statement per successful flush');
      await buf.close();
    });

    t.test('the timer flushes every flushEveryMs and reports failures', async (t) => {
      await sql.query('DELETE FROM pool_metrics_minute');
      const errors: unknown[] = [];
      const w = watched(sql);
      w.down = true;
      const buf = new RollupBuffer({ db: w.db, flushEveryMs: 30, now: () => clock, onError: (e) => errors.push(e) });
      t.teardown(() => buf.close());
      buf.add(beta, 'requests', 7);
      await until('a failing timer flush reported', () => errors.length >= 1);
      t.pass('a failing timer flush is reported');
      w.down = false;
      await until('the timer to write the row once the store is back', async () => (await rows(sql)).length > 0);
      await buf.close(); // a last flush: a count given back twice would show now
      t.same((await rows(sql)).map((r) => r.requests), [7], 'written once the store is back, counted once');
    });

    t.test("rows of a pool deleted meanwhile don't block the batch", async (t) => {
      await sql.query('DELETE FROM pool_metrics_minute');
      const buf = new RollupBuffer({ db: sql, flushEveryMs: 0, now: () => clock });
      buf.add(alpha, 'requests');
      buf.add(999_999, 'requests');
      await buf.close();
      t.same((await rows(sql)).map((r) => r.pool_id), [alpha]);
    });
  });
}

suite('pglite', async () => {
  const sql = await openPglite(null);
  return { sql, done: () => sql.close() };
});
suite('postgres', async () => {
  const db = await freshPostgresDatabase();
  const sql = await openPostgres(db.url);
  return {
    sql,
    async done() {
      await sql.close();
      await db.drop();
    },
  };
});
