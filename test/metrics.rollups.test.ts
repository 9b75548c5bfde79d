// Per-minute pool rollups: counted in memory, written in one multi-row upsert per flush, kept on failure.
import t from 'tap';
import { openPglite } from '../src/store/pglite.js';
import { openPostgres } from '../src/store/postgres.js';
import { migrate } from '../src/store/migrate.js';
import type { Queryable, Sql, SqlParam } from '../src/store/sql.js';
import { RollupBuffer } from '../src/metrics/rollups.js';
import { freshPostgresDatabase } from './helpers/service.js';
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

    t.test('the timer flushes every flushEveryMs and reports failures', async (t) => {
      await sql.query('DELETE FROM pool_metrics_minute');
      const errors: unknown[] = [];
      const w = watched(sql);
      w.down = true;
      const buf = new RollupBuffer({ db: w.db, flushEveryMs: 30, now: () => clock, onError: (e) => errors.push(e) });
      t.teardown(() => buf.close());
      buf.add(beta, 'requests', 7);
      await new Promise((r) => setTimeout(r, 80));
      t.ok(errors.length >= 1, 'a failing timer flush is reported');
      w.down = false;
      await new Promise((r) => setTimeout(r, 80));
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
