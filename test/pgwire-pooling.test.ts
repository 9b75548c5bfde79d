// Transaction pooling through the PostgreSQL wire listener under load and faults: max_concurrent enforced
// upstream under 50 clients, cancel, a client killed mid-transaction, server connections terminated
// upstream, governor refusals, and nothing held afterwards.
import t from 'tap';
import pg from 'pg';
import { needServer } from './helpers/servers.js';
import { startWirePool, type WirePool } from './helpers/pgwire.js';
import { until as waitFor } from './helpers/until.js';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  const MAX = 3;
  const w: WirePool = await startWirePool({ maxConcurrent: MAX });
  t.teardown(() => w.close());
  const listener = () => w.svc.service.pgWire!;
  const inFlight = () => w.svc.service.dataplane!.governor.state(w.poolId).inFlight;
  /** The shared until, naming the listener's counts when a wait runs out. */
  const until = (what: string, check: () => boolean | Promise<boolean>, ms = 20_000) =>
    waitFor(() => `${what}: ${JSON.stringify(listener().counts())}, in flight ${inFlight()}`, check, ms);
  const quiet = () => until('the listener to settle', () => {
    const c = listener().counts();
    return c.linked === 0 && c.clients === 0 && c.serversOpen === c.serversIdle && inFlight() === 0;
  });
  const connect = async (extra: Partial<pg.ClientConfig> = {}) => {
    const c = new pg.Client(w.clientConfig(extra));
    c.on('error', () => {});
    await c.connect();
    return c;
  };

  t.test('max_concurrent is never exceeded upstream with 50 clients', async (t) => {
    await w.direct.query(`CREATE TABLE IF NOT EXISTS seen (n int); GRANT ALL ON seen TO ${w.role}`);
    let peak = 0;
    let sampling = true;
    const sampler = (async () => {
      const probe = new pg.Client({ connectionString: `postgres://postgres@127.0.0.1:5432/${w.db}` });
      await probe.connect();
      while (sampling) {
        const r = await probe.query<{ busy: number; total: number }>(
          `SELECT count(*) FILTER (WHERE state <> 'idle')::int AS busy, count(*)::int AS total FROM pg_stat_activity WHERE usename = $1`,
          [w.role],
        );
        peak = Math.max(peak, r.rows[0]!.total);
        await new Promise((r) => setTimeout(r, 5));
      }
      await probe.end();
    })();
    const clients = await Promise.all(Array.from({ length: 50 }, () => connect()));
    await Promise.all(
      clients.map(async (c, i) => {
        for (let k = 0; k < 4; k++) {
          await c.query('BEGIN');
          await c.query('SELECT pg_sleep(0.01)');
          await c.query('INSERT INTO seen VALUES ($1)', [i]);
          await c.query('COMMIT');
        }
      }),
    );
    sampling = false;
    await sampler;
    await Promise.all(clients.map((c) => c.end()));
    const n = await w.direct.query('SELECT count(*)::int AS n FROM seen');
    t.equal(n.rows[0].n, 200, 'every transaction committed');
    t.ok(peak >= 1 && peak <= MAX, `at most ${MAX} server connections of the pool role at any time (peak ${peak})`);
    await quiet();
  });

  t.test('a CancelRequest through the listener stops the running query', async (t) => {
    const victim = await connect();
    const started = Date.now();
    const running = victim.query('SELECT pg_sleep(30)').then(() => null, (e: { code?: string }) => e);
    await until('the query to run upstream', async () => {
      const r = await w.direct.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1 AND query LIKE '%pg_sleep(30)%' AND state = 'active'`, [w.role]);
      return r.rows[0].n === 1;
    });
    const canceller = new pg.Client(w.clientConfig());
    (canceller as unknown as { cancel(c: pg.Client, q: unknown): void }).cancel(victim, (victim as unknown as { activeQuery: unknown }).activeQuery);
    const err = await running;
    t.equal(err?.code, '57014', 'the query was cancelled (query_canceled)');
    t.ok(Date.now() - started < 25_000, 'well before the sleep would have ended');
    const after = await victim.query('SELECT 7 AS n');
    t.equal(after.rows[0].n, 7, 'the connection works after the cancel');
    await victim.end();
    await quiet();
  });

  t.test('a client killed mid-transaction: its insert is never committed and the server connection is reused clean', async (t) => {
    await w.direct.query(`CREATE TABLE IF NOT EXISTS killed (v text); GRANT ALL ON killed TO ${w.role}`);
    const c = await connect();
    await c.query('BEGIN');
    await c.query("INSERT INTO killed VALUES ('idle-in-transaction')");
    (c as unknown as { connection: { stream: { destroy(): void } } }).connection.stream.destroy();
    // A second one dies while a statement is still running.
    const d = await connect();
    await d.query('BEGIN');
    await d.query("INSERT INTO killed VALUES ('mid-statement')");
    void d.query('SELECT pg_sleep(30)').catch(() => {});
    await until('the statement to run', async () => {
      const r = await w.direct.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1 AND query LIKE '%pg_sleep(30)%' AND state = 'active'`, [w.role]);
      return r.rows[0].n === 1;
    });
    (d as unknown as { connection: { stream: { destroy(): void } } }).connection.stream.destroy();
    await quiet();
    await until('no open transaction upstream', async () => {
      const r = await w.direct.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1 AND (state LIKE 'idle in transaction%' OR state = 'active')`, [w.role]);
      return r.rows[0].n === 0;
    });
    const rows = await w.direct.query('SELECT count(*)::int AS n FROM killed');
    t.equal(rows.rows[0].n, 0, 'neither insert was committed');
    const e = await connect();
    const r = await e.query('SELECT now() = statement_timestamp() AS fresh, count(*)::int AS n FROM killed');
    t.equal(r.rows[0].fresh, true, 'the next client starts outside any transaction');
    t.equal(r.rows[0].n, 0);
    await e.end();
    t.ok((await w.backends()) <= MAX, 'no server connection leaked');
    await quiet();
  });

  t.test('server connections terminated upstream: the server\'s own FATAL to the client inside a transaction; a client between transactions never notices', async (t) => {
    const inTx = new pg.Client(w.clientConfig());
    const told = new Promise<string | undefined>((resolve) => inTx.on('error', (e: Error & { code?: string }) => resolve(e.code)));
    await inTx.connect();
    const idle = await connect();
    await idle.query('SELECT 1');
    await inTx.query('BEGIN');
    await inTx.query('SELECT 1');
    await w.direct.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1', [w.role]);
    await until('the listener to see its server connections go', () => listener().counts().serversOpen === 0);
    t.equal(await told, '57P01', 'the client inside a transaction gets the server\'s 57P01, as it would directly');
    const other = await idle.query('SELECT 4 AS n');
    t.equal(other.rows[0].n, 4, 'a client between transactions never noticed');
    await inTx.end().catch(() => {});
    await idle.end();
    await quiet();
  });

  t.test('governor refusal: queue full gives 53300 and the client stays usable', async (t) => {
    await w.patch({ max_concurrent: 1, settings: { queueLength: 0, adaptive: false } });
    const holder = await connect();
    await holder.query('BEGIN');
    const other = await connect();
    const err = await other.query('SELECT 1').then(() => null, (e: { code?: string; message: string }) => e);
    t.equal(err?.code, '53300', err?.message);
    const errExt = await other.query('SELECT $1::int AS n', [5]).then(() => null, (e: { code?: string }) => e);
    t.equal(errExt?.code, '53300', 'an extended-protocol batch is refused the same way');
    await holder.query('COMMIT');
    const ok = await other.query('SELECT $1::int AS n', [6]);
    t.equal(ok.rows[0].n, 6, 'once the slot is free the same client is served');
    await holder.end();
    await other.end();
    await w.patch({ max_concurrent: MAX, settings: { queueLength: null, adaptive: null } });
    await quiet();
  });

  t.test('nothing is left held', async (t) => {
    await quiet();
    const c = listener().counts();
    t.equal(c.clients, 0);
    t.equal(c.linked, 0);
    t.equal(c.serversOpen, c.serversIdle, 'every open server connection is idle');
    t.ok(c.serversOpen <= MAX);
    t.equal(inFlight(), 0, 'no slot held');
    const stuck = await w.direct.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1 AND state <> 'idle'`, [w.role]);
    t.equal(stuck.rows[0].n, 0, 'no upstream backend busy or inside a transaction');
  });
}
