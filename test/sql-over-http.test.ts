// SQL over HTTP on a postgres pool, against the local PostgreSQL: the pool is created and given its role
// through the Control API, queried through the data plane, and checked with a direct connection.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { Pool } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { until } from './helpers/until.js';
import { needServer, PG_URL } from './helpers/servers.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { runSqlRequest } from '../src/db/sql-over-http.js';
import { DbUpstreams } from '../src/db/upstream.js';

const suffix = randomBytes(4).toString('hex');
const ROLE = `sqlhttp_role_${suffix}`;
const ROLE2 = `sqlhttp_role2_${suffix}`;
const DB = `sqlhttp_db_${suffix}`;
const PASSWORD = 'secret-Pa55';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  await admin.query(`CREATE ROLE ${ROLE} LOGIN PASSWORD '${PASSWORD}'`);
  await admin.query(`CREATE ROLE ${ROLE2} LOGIN PASSWORD '${PASSWORD}'`);
  await admin.query(`CREATE DATABASE ${DB} OWNER ${ROLE}`);
  // A direct connection to the test database (as the superuser) to check what the pool did.
  const direct = new pg.Client({ connectionString: PG_URL.replace(/\/[^/]*$/, `/${DB}`) });
  await direct.connect();
  await direct.query(`GRANT ALL ON SCHEMA public TO ${ROLE2}`);
  t.teardown(async () => {
    await direct.end();
    await admin.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
    await admin.query(`DROP ROLE IF EXISTS ${ROLE}`);
    await admin.query(`DROP ROLE IF EXISTS ${ROLE2}`);
    await admin.end();
  });

  const svc: TestService = await startTestService({ overrides: { dbAllowInsecure: true, accessLogFile: '/dev/null' } });
  t.teardown(() => svc.close());
  const boot = await svc.bootstrap();
  const created = await svc.api('POST', '/api/v1/pools/database', { token: boot.token, body: { db_host: 'localhost', db_port: 5432, db_name: DB } });
  const sub: string = created.body.data.subdomain;
  const poolId: number = created.body.data.id;
  const attached = await svc.api('PUT', `/api/v1/pools/${sub}/credential`, {
    token: boot.token,
    body: { method: 'postgres_role', username: ROLE, password: PASSWORD },
  });
  const writeKey: string = (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token: boot.token, body: { label: 'w' } })).body.data.key;
  const readKey: string = (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token: boot.token, body: { label: 'r', access: 'read' } })).body.data.key;
  const dp = svc.service.dataplane!;
  await dp.snapshots.reload();

  const http = new Pool(svc.proxyUrl!, { connections: 32 });
  t.teardown(() => http.close());
  const host = `${sub}.pools.localhost`;
  const sql = async (body: unknown, o: { key?: string | null; method?: 'POST' | 'GET' | 'PUT' | 'DELETE'; headers?: Record<string, string>; signal?: AbortSignal } = {}) => {
    const headers: Record<string, string> = { host, 'content-type': 'application/json', ...o.headers };
    const key = o.key === undefined ? writeKey : o.key;
    if (key !== null) headers['x-service-key'] = key;
    const res = await http.request({
      path: '/',
      method: o.method ?? 'POST',
      headers,
      body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
      signal: o.signal,
    });
    const text = await res.body.text();
    return { status: res.statusCode, headers: res.headers, body: text ? JSON.parse(text) : null };
  };
  /** Changes the pool's row in the store and waits until the data plane has reloaded it. */
  const setPool = async (maxConcurrent: number, settings: Record<string, unknown>) => {
    await svc.service.sql.query('UPDATE pools SET max_concurrent = $1, settings = $2 WHERE id = $3', [maxConcurrent, JSON.stringify(settings), poolId]);
    await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${poolId}`);
    await dp.snapshots.reload();
  };
  const backends = async (role = ROLE) =>
    (await direct.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1 AND datname = $2', [role, DB])).rows[0]!.n;
  const sleepers = async () =>
    (await direct.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1 AND state = 'active' AND query LIKE '%pg_sleep%'`,
      [ROLE],
    )).rows[0]!.n;

  t.test('the pool is created and given its role through the Control API', async (t) => {
    t.equal(created.status, 201);
    t.equal(created.body.data.backend, 'postgres');
    t.equal(attached.status, 200);
    t.equal(attached.body.data.has_credential, true);
  });

  t.test('column values round-trip as JSON that holds them exactly', async (t) => {
    const r = await sql({
      query: `SELECT 42::int4 AS i, 9007199254740993::int8 AS big, 12345678901234567890.125::numeric AS n, true AS b,
                     '\\x0102ff'::bytea AS bin, '2024-01-02 03:04:05.123456+02'::timestamptz AS tz,
                     '2024-01-02 03:04:05.5'::timestamp AS ts, '2024-02-29'::date AS d, '{"a": [1, 2.5, null]}'::jsonb AS j,
                     '[1,2]'::json AS js, NULL::text AS nothing, ARRAY[1, 2, NULL]::int4[] AS arr, ARRAY[9007199254740993]::int8[] AS bigs,
                     'NaN'::float8 AS nan, 1.5::float8 AS f, 'héllo'::text AS s, 'a1b2c3d4-0000-4000-8000-000000000001'::uuid AS u`,
    });
    t.equal(r.status, 200, r.status === 200 ? 'answered' : JSON.stringify(r.body));
    t.same(
      r.body.columns,
      [
        { name: 'i', type: 'integer' },
        { name: 'big', type: 'bigint' },
        { name: 'n', type: 'numeric' },
        { name: 'b', type: 'boolean' },
        { name: 'bin', type: 'bytea' },
        { name: 'tz', type: 'timestamp with time zone' },
        { name: 'ts', type: 'timestamp without time zone' },
        { name: 'd', type: 'date' },
        { name: 'j', type: 'jsonb' },
        { name: 'js', type: 'json' },
        { name: 'nothing', type: 'text' },
        { name: 'arr', type: 'integer[]' },
        { name: 'bigs', type: 'bigint[]' },
        { name: 'nan', type: 'double precision' },
        { name: 'f', type: 'double precision' },
        { name: 's', type: 'text' },
        { name: 'u', type: 'uuid' },
      ],
    );
    t.strictSame(r.body.rows, [
      [
        42, '9007199254740993', '12345678901234567890.125', true, Buffer.from([1, 2, 255]).toString('base64'),
        '2024-01-02T01:04:05.123456Z', '2024-01-02T03:04:05.5', '2024-02-29', { a: [1, 2.5, null] }, [1, 2], null, [1, 2, null],
        ['9007199254740993'], 'NaN', 1.5, 'héllo', 'a1b2c3d4-0000-4000-8000-000000000001',
      ],
    ]);
    t.equal(r.body.command, 'SELECT');
    t.equal(r.body.rowCount, 1);
    t.ok(r.headers['x-service-effective-limit'], 'governor headers on the answer');
  });

  t.test('params are bound, never spliced into the SQL', async (t) => {
    const r = await sql({
      query: 'SELECT $1::text AS s, $2::int8 + 1 AS n, $3::jsonb AS j, $4::bool AS b, $5::text IS NULL AS isnull, $6::int4[] AS a',
      params: ["it's'; DROP TABLE x; --", '9007199254740992', { k: 'v' }, false, null, [3, 4]],
    });
    t.equal(r.status, 200, r.status === 200 ? 'answered' : JSON.stringify(r.body));
    t.strictSame(r.body.rows, [["it's'; DROP TABLE x; --", '9007199254740993', { k: 'v' }, false, true, [3, 4]]]);
  });

  t.test('a batch runs in one transaction and commits', async (t) => {
    const r = await sql({
      queries: [
        { query: 'CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2))' },
        { query: 'INSERT INTO items VALUES ($1, $2, $3), ($4, $5, $6)', params: [1, 'one', '1.10', 2, 'two', '2.20'] },
        { query: 'SELECT id, name, price FROM items ORDER BY id' },
      ],
    });
    t.equal(r.status, 200, r.status === 200 ? 'answered' : JSON.stringify(r.body));
    t.equal(r.body.results.length, 3);
    t.equal(r.body.results[0].command, 'CREATE');
    t.equal(r.body.results[1].command, 'INSERT');
    t.equal(r.body.results[1].rowCount, 2);
    t.strictSame(r.body.results[2].rows, [[1, 'one', '1.10'], [2, 'two', '2.20']]);
    const check = await direct.query('SELECT count(*)::int AS n FROM items');
    t.equal(check.rows[0].n, 2, 'committed: visible on a direct connection');
  });

  t.test('a failing batch rolls back whole and names the failing statement', async (t) => {
    const r = await sql({
      queries: [
        { query: 'INSERT INTO items VALUES (10, $1, 1)', params: ['ten'] },
        { query: 'UPDATE items SET name = $1 WHERE id = 1', params: ['changed'] },
        { query: 'INSERT INTO items VALUES (2, $1, 2)', params: ['duplicate'] },
        { query: 'INSERT INTO items VALUES (11, $1, 1)', params: ['never'] },
      ],
    });
    t.equal(r.status, 409);
    t.equal(r.body.error, 'database_error');
    t.equal(r.body.code, '23505');
    t.equal(r.body.index, 2);
    t.match(r.body.message, /duplicate key/);
    const rows = await direct.query('SELECT id, name FROM items ORDER BY id');
    t.strictSame(rows.rows, [{ id: 1, name: 'one' }, { id: 2, name: 'two' }], 'nothing of the batch remains');
    // The connection went back clean: the next request is not inside the aborted transaction.
    const next = await sql({ query: 'SELECT count(*)::int AS n FROM items' });
    t.strictSame(next.body.rows, [[2]]);
  });

  t.test('database errors carry their SQLSTATE', async (t) => {
    const syntax = await sql({ query: 'SELEC 1' });
    t.equal(syntax.status, 400);
    t.match(syntax.body, { error: 'database_error', code: '42601', position: 1 });
    const missing = await sql({ query: 'SELECT * FROM no_such_table' });
    t.match(missing, { status: 400, body: { code: '42P01' } });
    const divide = await sql({ query: 'SELECT 1 / $1::int', params: [0] });
    t.match(divide, { status: 400, body: { code: '22012' } });
    const notNull = await sql({ query: 'INSERT INTO items (id, name) VALUES (99, NULL)' });
    t.match(notNull, { status: 409, body: { code: '23502' } });
    const twoStatements = await sql({ query: 'SELECT 1; SELECT 2' });
    t.match(twoStatements, { status: 400, body: { code: '42601' } }, 'one statement per query');
  });

  t.test('a write of a role without the privilege is refused by the database (403)', async (t) => {
    await direct.query('CREATE TABLE locked (id int)');
    await direct.query(`REVOKE ALL ON locked FROM ${ROLE}`);
    await direct.query('ALTER TABLE locked OWNER TO postgres');
    const r = await sql({ query: 'INSERT INTO locked VALUES (1)' }, { key: readKey });
    t.match(r, { status: 403, body: { error: 'database_error', code: '42501' } });
  });

  t.test('read and write keys connect as the same role; no key is 401; only POST', async (t) => {
    const w = await sql({ query: 'SELECT current_user AS u' });
    const r = await sql({ query: 'SELECT current_user AS u' }, { key: readKey });
    t.strictSame(w.body.rows, [[ROLE]]);
    t.strictSame(r.body.rows, [[ROLE]], 'a read key queries with POST: method scope does not apply');
    const none = await sql({ query: 'SELECT 1' }, { key: null });
    t.equal(none.status, 401);
    t.equal(none.body.error, 'unauthorized');
    const wrong = await sql({ query: 'SELECT 1' }, { key: 'pk_wrong' });
    t.equal(wrong.status, 401);
    for (const method of ['GET', 'PUT', 'DELETE'] as const) {
      const m = await sql(undefined, { method });
      t.equal(m.status, 405, method);
      t.equal(m.headers.allow, 'POST');
      t.equal(m.body.error, 'method_not_allowed');
    }
    // HEAD: 405 without a body, and the keep-alive connection stays usable.
    const head = await http.request({ path: '/', method: 'HEAD', headers: { host, 'x-service-key': writeKey } });
    t.equal(head.statusCode, 405);
    t.equal(await head.body.text(), '');
    t.equal((await sql({ query: 'SELECT 1' })).status, 200);
    const readGet = await sql(undefined, { key: readKey, method: 'GET' });
    t.equal(readGet.status, 405, 'a read key with GET is 405 too, not 403');
  });

  t.test('malformed requests are 400 before any slot or connection', async (t) => {
    for (const body of ['not json', '[]', '{}', '{"query": ""}', '{"query": 1}', '{"query": "SELECT 1", "params": {}}', '{"queries": []}',
      '{"query": "SELECT 1", "extra": 1}', '{"queries": [{"query": "SELECT 1"}], "query": "x"}', '{"queries": [{"sql": "SELECT 1"}]}']) {
      const r = await sql(body);
      t.equal(r.status, 400, body);
      t.equal(r.body.error, 'bad_request', body);
    }
    const huge = await sql({ query: `SELECT '${'x'.repeat(1024 * 1024)}'` });
    t.equal(huge.status, 413, 'bodies over sqlBodyLimit');
  });

  t.test('max_concurrent bounds the queries running on the database', async (t) => {
    await setPool(2, {});
    let peak = 0;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        peak = Math.max(peak, await sleepers());
        await new Promise((r) => setTimeout(r, 15));
      }
    })();
    const started = performance.now();
    const all = await Promise.all(Array.from({ length: 6 }, () => sql({ query: 'SELECT pg_sleep(0.3)' })));
    const elapsed = performance.now() - started;
    sampling = false;
    await sampler;
    t.same(all.map((r) => r.status), [200, 200, 200, 200, 200, 200], JSON.stringify(all.map((r) => r.body.message ?? null)));
    t.equal(peak, 2, 'two statements at a time, never more');
    t.ok(elapsed >= 850, `three waves (${Math.round(elapsed)} ms)`);
    t.ok((await backends()) <= 2, 'the upstream connection pool holds at most max_concurrent connections');
  });

  t.test('a query past requestTimeoutMs is cancelled, answered 504, and its slot released', async (t) => {
    await setPool(1, { requestTimeoutMs: 400 });
    const started = performance.now();
    const r = await sql({ query: 'SELECT pg_sleep(5)' });
    const elapsed = performance.now() - started;
    t.equal(r.status, 504);
    t.equal(r.body.error, 'upstream_timeout');
    t.ok(elapsed < 2000, `answered after ${Math.round(elapsed)} ms`);
    // The cancel has stopped it by the time the 504 is out; the backend reports itself idle a moment after its error.
    await until('the cancelled statement to leave pg_stat_activity', async () => (await sleepers()) === 0, 2000, 10);
    t.pass('the statement no longer runs on the database, long before its 5 s');
    // A timed-out batch is rolled back whole.
    const batch = await sql({ queries: [{ query: 'INSERT INTO items VALUES (50, $1, 1)', params: ['late'] }, { query: 'SELECT pg_sleep(5)' }] });
    t.equal(batch.status, 504);
    t.equal((await direct.query('SELECT count(*)::int AS n FROM items WHERE id = 50')).rows[0].n, 0);
    // The only slot is free again: a fail-fast request is admitted. Its timeout is generous: the timed-out
    // server connections were dropped, and opening a new one can take longer than 400 ms on a loaded machine.
    await setPool(1, { requestTimeoutMs: 30_000 });
    const next = await sql({ query: 'SELECT 1 AS one' }, { headers: { 'x-service-no-queue': '1' } });
    t.equal(next.status, 200);
    await setPool(2, {});
  });

  t.test('a client that disconnects cancels its query', async (t) => {
    const ctl = new AbortController();
    const pending = sql({ query: 'SELECT pg_sleep(5)' }, { signal: ctl.signal }).catch((err: Error) => err);
    for (let i = 0; i < 100 && (await sleepers()) === 0; i++) await new Promise((r) => setTimeout(r, 10));
    t.equal(await sleepers(), 1, 'running');
    ctl.abort();
    t.type(await pending, Error);
    let left = 1;
    for (let i = 0; i < 100 && left > 0; i++) {
      await new Promise((r) => setTimeout(r, 10));
      left = await sleepers();
    }
    t.equal(left, 0, 'cancelled on the database');
    const next = await sql({ query: 'SELECT 1' }, { headers: { 'x-service-no-queue': '1' } });
    t.equal(next.status, 200, 'its slot was released');
  });

  t.test('a lone BEGIN never leaks an open transaction into the next request', async (t) => {
    await setPool(1, {});
    const begin = await sql({ query: 'BEGIN' });
    t.equal(begin.status, 200);
    const ins = await sql({ query: 'INSERT INTO items VALUES (60, $1, 1)', params: ['autocommit'] });
    t.equal(ins.status, 200);
    t.equal((await direct.query('SELECT count(*)::int AS n FROM items WHERE id = 60')).rows[0].n, 1, 'committed at once');
    await setPool(2, {});
  });

  t.test('no connection leak after 500 requests', async (t) => {
    await setPool(4, {});
    let failures = 0;
    const work = async (n: number) => {
      for (let i = 0; i < n; i++) {
        const kind = i % 5;
        const r =
          kind === 0 ? await sql({ query: 'SELECT $1::int AS i', params: [i] })
          : kind === 1 ? await sql({ query: 'SELEC broken' })
          : kind === 2 ? await sql({ queries: [{ query: 'SELECT 1' }, { query: 'SELECT 1/0' }] })
          : kind === 3 ? await sql({ queries: [{ query: 'SELECT 1' }, { query: 'SELECT 2' }] })
          : await sql({ query: 'SELECT 1' }, { key: readKey });
        if (![200, 400].includes(r.status)) failures++;
      }
    };
    await Promise.all(Array.from({ length: 10 }, () => work(50)));
    t.equal(failures, 0);
    t.ok((await backends()) <= 4, `at most max_concurrent connections stay open (${await backends()})`);
    t.equal(dp.inFlight, 0, 'every request released');
    t.equal(dp.governor.state(poolId).inFlight, 0, 'every slot released');
  });

  t.test('a new credential replaces the connection pool (the old connections close)', async (t) => {
    t.ok((await backends(ROLE)) > 0, 'connections of the first role are open');
    const put = await svc.api('PUT', `/api/v1/pools/${sub}/credential`, { token: boot.token, body: { method: 'postgres_role', username: ROLE2, password: PASSWORD } });
    t.equal(put.status, 200);
    await dp.snapshots.reload();
    const r = await sql({ query: 'SELECT current_user' });
    t.strictSame(r.body.rows, [[ROLE2]]);
    let old = 1;
    for (let i = 0; i < 100 && old > 0; i++) {
      old = await backends(ROLE);
      if (old > 0) await new Promise((r) => setTimeout(r, 10));
    }
    t.equal(old, 0, 'the old pool was closed');
  });

  t.test('runSqlRequest: the async jobs runner gets a database job detail', async (t) => {
    const pool = dp.snapshots.current.pools.get(sub)!;
    const one = await runSqlRequest(dp.databases, pool, JSON.stringify({ query: 'SELECT $1::int AS x', params: [7] }));
    t.match(one, { ok: true, status: 200, detail: { kind: 'database', columns: [{ name: 'x', type: 'integer' }], rows: [[7]] } });
    const batch = await runSqlRequest(dp.databases, pool, Buffer.from(JSON.stringify({ queries: [{ query: 'SELECT 1 AS a' }, { query: 'SELECT 2 AS b' }] })));
    t.match(batch, { ok: true, detail: { kind: 'database', results: [{ rows: [[1]] }, { rows: [[2]] }] } });
    const bad = await runSqlRequest(dp.databases, pool, '{"query": "SELEC"}');
    t.match(bad, { ok: false, status: 400, body: { error: 'database_error', code: '42601' } });
  });

  t.test('db_sslmode is enforced: a server without TLS is refused unless dbAllowInsecure', async (t) => {
    // The data plane runs with dbAllowInsecure (the local server has no TLS); a strict DbUpstreams shows the default.
    const strict = new DbUpstreams({ allowInsecure: false, allowPrivate: true, log: svc.service.log });
    t.teardown(() => strict.close());
    const pool = dp.snapshots.current.pools.get(sub)!;
    t.equal(pool.database!.sslmode, 'verify-full', 'db_sslmode defaults to verify-full');
    for (const sslmode of ['verify-full', 'require'] as const) {
      const r = await strict.run({ ...pool, database: { ...pool.database!, sslmode } }, [{ query: 'SELECT 1', params: [] }], { timeoutMs: 5000, transaction: false });
      t.match(r, { ok: false, failure: { kind: 'unreachable', message: /SSL/ } }, sslmode);
    }
  });

  t.test('every connection re-checks the address it dials (allowPrivateTargets off: loopback refused)', async (t) => {
    const guarded = new DbUpstreams({ allowInsecure: true, allowPrivate: false, log: svc.service.log });
    t.teardown(() => guarded.close());
    const pool = dp.snapshots.current.pools.get(sub)!;
    for (const host of ['localhost', '127.0.0.1']) {
      const r = await guarded.run({ ...pool, database: { ...pool.database!, host } }, [{ query: 'SELECT 1', params: [] }], { timeoutMs: 5000, transaction: false });
      t.match(r, { ok: false, failure: { kind: 'unreachable', message: /loopback, private/ } }, host);
    }
  });

  t.test('an unreachable database is 502 and the slot is released', async (t) => {
    await svc.service.sql.query('UPDATE pools SET db_port = 1 WHERE id = $1', [poolId]);
    await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${poolId}`);
    await dp.snapshots.reload();
    const r = await sql({ query: 'SELECT 1' });
    t.equal(r.status, 502);
    t.equal(r.body.error, 'upstream_unreachable');
    t.match(r.body.message, /ECONNREFUSED/);
    t.equal(dp.governor.state(poolId).inFlight, 0, 'slot released');
  });
}
