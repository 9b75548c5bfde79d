// The PostgreSQL wire listener with real clients (psql, node-postgres) against the local PostgreSQL: login
// with the pool key, transaction pooling, COPY, errors for bad logins, and no slot or connection left over.
import t from 'tap';
import pg from 'pg';
import { needServer } from './helpers/servers.js';
import { runTool, startWirePool, type WirePool } from './helpers/pgwire.js';
import { TestClock } from './helpers/test-clock.js';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  // The service's clock, moved ahead past a key's expiry instead of sleeping through it.
  const clock = new TestClock();
  const w: WirePool = await startWirePool({ maxConcurrent: 4, overrides: { wireMaxPreparedStatements: 3 }, now: clock.now });
  t.teardown(() => w.close());
  const listener = () => w.svc.service.pgWire!;
  const governor = () => w.svc.service.dataplane!.governor;
  const psql = (args: string[], o: { input?: string; env?: Record<string, string>; conninfo?: string } = {}) =>
    runTool('psql', ['-X', '-v', 'ON_ERROR_STOP=1', '-At', o.conninfo ?? w.conninfo(), ...args], { input: o.input, env: o.env });
  /** Waits until the listener holds no slot and no linked or busy server connection. */
  const settled = async () => {
    for (let i = 0; i < 200; i++) {
      const c = listener().counts();
      if (c.linked === 0 && c.clients === 0 && governor().state(w.poolId).inFlight === 0 && c.serversOpen === c.serversIdle) return c;
      await new Promise((r) => setTimeout(r, 50));
    }
    return listener().counts();
  };

  t.test('psql runs a query through the listener, the pool named by options=pool=<sub> and the key as password', async (t) => {
    const r = await psql(['-c', "SELECT current_user, 40 + 2 AS answer"]);
    t.equal(r.code, 0, r.stderr);
    t.equal(r.stdout.trim(), `${w.role}|42`, 'the query ran upstream as the pool role');
  });

  t.test('PGOPTIONS names the pool for libpq programs', async (t) => {
    const r = await runTool('psql', ['-X', '-At', '-c', 'SELECT 1'], {
      env: { PGHOST: '127.0.0.1', PGPORT: String(w.port), PGUSER: 'x', PGDATABASE: 'y', PGPASSWORD: w.key, PGOPTIONS: `-c pool=${w.sub}`, PGSSLMODE: 'disable' },
    });
    t.equal(r.code, 0, r.stderr);
    t.equal(r.stdout.trim(), '1');
  });

  t.test('the startup user names the pool when neither SNI nor options does', async (t) => {
    // As node-postgres's own suite runs with PGUSER=<sub>: its files that set their own options
    // (gh-issues/2416, client/connection-parameter-tests) lost the pool named in PGOPTIONS.
    const byUser = new pg.Client(w.clientConfig({ user: w.sub, options: undefined }));
    await byUser.connect();
    t.same((await byUser.query('SELECT current_user AS u, 40 + 2 AS answer')).rows, [{ u: w.role, answer: 42 }], 'runs upstream as the pool role');
    await byUser.end();
    const upper = new pg.Client(w.clientConfig({ user: w.sub.toUpperCase(), options: undefined }));
    await upper.connect();
    t.equal((await upper.query('SELECT 1 AS n')).rows[0].n, 1, 'in any case, as a subdomain is');
    await upper.end();

    await w.direct.query('CREATE SCHEMA IF NOT EXISTS by_user');
    await w.direct.query(`GRANT USAGE ON SCHEMA by_user TO ${w.role}`);
    const own = new pg.Client(w.clientConfig({ user: w.sub, options: '-c search_path=by_user' }));
    await own.connect();
    t.equal((await own.query('SHOW search_path')).rows[0].search_path, 'by_user', "the client's own options apply (gh-issues/2416)");
    await own.end();
    const iso = new pg.Client(w.clientConfig({ user: w.sub, options: '--default_transaction_isolation=serializable' }));
    await iso.connect();
    t.equal((await iso.query('SHOW default_transaction_isolation')).rows[0].default_transaction_isolation, 'serializable', 'client/connection-parameter-tests');
    await iso.end();

    const r = await runTool('psql', ['-X', '-At', '-c', 'SELECT current_user'], {
      env: { PGHOST: '127.0.0.1', PGPORT: String(w.port), PGUSER: w.sub, PGDATABASE: 'y', PGPASSWORD: w.key, PGSSLMODE: 'disable', PGOPTIONS: '' },
    });
    t.equal(r.code, 0, r.stderr);
    t.equal(r.stdout.trim(), w.role, 'psql with PGUSER=<sub>');

    // options still wins when it names a pool: user is ignored then (here a pool's name, there no pool).
    const fails = (c: pg.Client) => {
      c.on('error', () => {});
      return c.connect().then(
        async () => {
          await c.end();
          return null;
        },
        (e: { code?: string; message: string }) => e,
      );
    };
    t.equal((await fails(new pg.Client(w.clientConfig({ user: 'nobody-here' }))))?.code ?? null, null, 'options=pool= names the pool; user is ignored');
    t.equal((await fails(new pg.Client(w.clientConfig({ user: w.sub, options: 'pool=nosuchpool' }))))?.code, '3D000', 'options names the pool even when user is one');
    // An unknown user with nothing else naming a pool: a login error, as node-postgres's client/error-handling-tests expects.
    const unknown = await fails(new pg.Client(w.clientConfig({ user: 'asldkfjsadlfkj', options: undefined })));
    t.equal(unknown?.code, '28000', unknown?.message);
    t.match(unknown?.message, /no pool named: user "asldkfjsadlfkj" is not a pool; log in as user=<subdomain>/);
    const p = await runTool('psql', ['-X', '-At', '-c', 'SELECT 1'], {
      env: { PGHOST: '127.0.0.1', PGPORT: String(w.port), PGUSER: 'nosuchpool', PGDATABASE: 'y', PGPASSWORD: w.key, PGSSLMODE: 'disable', PGOPTIONS: '' },
    });
    t.not(p.code, 0, 'psql with an unknown PGUSER fails');
    t.match(p.stderr, /no pool named: user "nosuchpool" is not a pool/);
    await new Promise<void>((resolve, reject) => {
      // The callback form node-postgres's test uses.
      const c = new pg.Client(w.clientConfig({ user: 'asldkfjsadlfkj', options: undefined }));
      c.connect((err) => (err instanceof Error ? resolve() : reject(new Error('connected as an unknown user'))));
    });
  });

  t.test('a psql script with a transaction, COPY FROM STDIN and COPY TO STDOUT', async (t) => {
    const script = [
      'CREATE TABLE items (id int PRIMARY KEY, name text);',
      'BEGIN;',
      "INSERT INTO items VALUES (1, 'one');",
      "INSERT INTO items VALUES (2, 'two');",
      'COMMIT;',
      'COPY items FROM STDIN;',
      '3\tthree',
      '4\tfour',
      '\\.',
      'COPY (SELECT id, name FROM items ORDER BY id) TO STDOUT;',
      'SELECT count(*) FROM items;',
    ].join('\n');
    const r = await psql(['-f', '-'], { input: script });
    t.equal(r.code, 0, r.stderr);
    t.match(r.stdout, /1\tone\n2\ttwo\n3\tthree\n4\tfour\n4/, 'COPY out returned the rows copied in and inserted');
    const direct = await w.direct.query('SELECT count(*)::int AS n FROM items');
    t.equal(direct.rows[0].n, 4, 'the rows are committed upstream');
  });

  t.test('a wrong key, an unknown pool, no pool at all: clean errors with their SQLSTATEs', async (t) => {
    const wrong = new pg.Client(w.clientConfig({ password: 'not-a-key' }));
    const e1 = await wrong.connect().then(() => null, (e: { code?: string; message: string }) => e);
    t.equal(e1?.code, '28P01', e1?.message);
    const unknown = new pg.Client(w.clientConfig({ options: 'pool=nosuchpool' }));
    const e2 = await unknown.connect().then(() => null, (e: { code?: string; message: string }) => e);
    t.equal(e2?.code, '3D000', e2?.message);
    const none = new pg.Client(w.clientConfig({ options: undefined }));
    const e3 = await none.connect().then(() => null, (e: { code?: string; message: string }) => e);
    t.equal(e3?.code, '28000', `no pool named, and user 'anyone' is no pool: ${e3?.message}`);
    const r = await psql(['-c', 'SELECT 1'], { conninfo: w.conninfo({ password: 'bad' }) });
    t.not(r.code, 0);
    t.match(r.stderr, /password authentication failed for pool/);
  });

  t.test("a logged-in client's next transaction is refused once its key is revoked or has expired", async (t) => {
    // The listener re-checks the key only when the snapshot changed or the key's expiry came: both must still bite.
    const mint = async (body: Record<string, unknown> = {}) =>
      (await w.svc.api('POST', `/api/v1/pools/${w.sub}/keys`, { token: w.token, body: { label: 'session', ...body } })).body.data as { id: number; key: string };
    const dp = w.svc.service.dataplane!;
    const refusal = (c: pg.Client) => c.query('SELECT 1').then(() => null, (e: { code?: string; message: string }) => e);

    const revoked = await mint();
    await dp.snapshots.reload();
    const a = new pg.Client(w.clientConfig({ password: revoked.key }));
    a.on('error', () => {});
    await a.connect();
    for (let i = 0; i < 3; i++) t.equal((await a.query('SELECT 1 AS one')).rows[0].one, 1, `transaction ${i} runs`);
    const r = await w.svc.api('DELETE', `/api/v1/pools/${w.sub}/keys/${revoked.id}`, { token: w.token });
    t.equal(r.status, 200);
    // No reload here: the revocation arrives as a key point update (the snapshot object stays the same).
    const revokedAt = Date.now();
    let e1: { code?: string; message: string } | null = null;
    while (e1 === null && Date.now() - revokedAt < 3000) {
      e1 = await refusal(a);
      if (e1 === null) await new Promise((resolve) => setTimeout(resolve, 50));
    }
    t.equal(e1?.code, '28P01', `revoked: ${e1?.message}`);
    t.ok(Date.now() - revokedAt < 2000, `refused within the change feed's delay (${Date.now() - revokedAt} ms)`);

    // Expiry passes on the clock alone: no snapshot change announces it.
    const expiring = await mint();
    await w.svc.service.sql.query("UPDATE pool_keys SET expires_at = now() + interval '1500 milliseconds' WHERE id = $1", [expiring.id]);
    await dp.snapshots.reload();
    const b = new pg.Client(w.clientConfig({ password: expiring.key }));
    b.on('error', () => {});
    await b.connect();
    t.equal((await b.query('SELECT 2 AS two')).rows[0].two, 2, 'runs before its expiry');
    clock.advance(1700);
    const e2 = await refusal(b);
    t.equal(e2?.code, '28P01', `expired: ${e2?.message}`);
    await a.end().catch(() => {});
    await b.end().catch(() => {});
  });

  t.test('node-postgres: named prepared statements across transactions with fewer server connections than clients', async (t) => {
    await w.direct.query(`CREATE TABLE IF NOT EXISTS counters (id int PRIMARY KEY, n int NOT NULL); GRANT ALL ON counters TO ${w.role}`);
    await w.direct.query('INSERT INTO counters SELECT g, 0 FROM generate_series(1, 8) g ON CONFLICT DO NOTHING');
    const clients = await Promise.all(
      Array.from({ length: 8 }, async () => {
        const c = new pg.Client(w.clientConfig());
        await c.connect();
        return c;
      }),
    );
    await Promise.all(
      clients.map(async (c, i) => {
        for (let round = 0; round < 10; round++) {
          await c.query('BEGIN');
          const r = await c.query({ name: 'bump', text: 'UPDATE counters SET n = n + $1 WHERE id = $2 RETURNING n', values: [1, i + 1] });
          await c.query({ name: 'read', text: 'SELECT n FROM counters WHERE id = $1', values: [i + 1] });
          await c.query('COMMIT');
          if (r.rows[0].n !== round + 1) throw new Error(`client ${i}: expected ${round + 1}, got ${r.rows[0].n}`);
          // Outside a transaction too: each statement is its own transaction, possibly on another server connection.
          const again = await c.query({ name: 'read', text: 'SELECT n FROM counters WHERE id = $1', values: [i + 1] });
          if (again.rows[0].n !== round + 1) throw new Error(`client ${i}: read ${again.rows[0].n}`);
        }
      }),
    );
    const sum = await w.direct.query('SELECT sum(n)::int AS s FROM counters');
    t.equal(sum.rows[0].s, 80, 'every increment landed once');
    t.ok((await w.backends()) <= 4, 'never more server connections than max_concurrent');
    await Promise.all(clients.map((c) => c.end()));
  });

  t.test('named prepared statements past wireMaxPreparedStatements: the least recently used is closed and prepared again when needed', async (t) => {
    // This file's poolgate keeps at most 3 per server connection; one client cycles through 8 statements,
    // some inside a transaction that uses more than 3 (none of those may be closed before it ends).
    const c = new pg.Client(w.clientConfig());
    await c.connect();
    const q = (i: number) => c.query({ name: `s${i}`, text: `SELECT $1::int + ${i} AS v`, values: [100] });
    for (let round = 0; round < 3; round++) {
      for (let i = 0; i < 8; i++) t.equal((await q(i)).rows[0].v, 100 + i, `round ${round}: s${i} answers`);
    }
    await c.query('BEGIN');
    for (let i = 0; i < 5; i++) await q(i);
    const inTx = await c.query('SELECT count(*)::int AS n FROM pg_prepared_statements');
    t.ok(inTx.rows[0].n >= 5, `the 5 statements of the open transaction are all prepared (${inTx.rows[0].n})`);
    await c.query('COMMIT');
    await q(7);
    // Run on whichever server connection is free: each holds at most the cap (+ what one transaction used).
    const after = await c.query('SELECT count(*)::int AS n FROM pg_prepared_statements');
    t.ok(after.rows[0].n <= 3, `back under the cap once a statement is prepared outside the transaction (${after.rows[0].n})`);
    await c.end();
  });

  t.test('nothing is left held', async (t) => {
    const c = await settled();
    t.equal(c.clients, 0, 'no client connections');
    t.equal(c.linked, 0, 'no linked server connections');
    t.equal(c.serversOpen, c.serversIdle, 'every open server connection is idle');
    t.equal(governor().state(w.poolId).inFlight, 0, 'no slot held');
  });
}
