// SQL over HTTP on a mysql pool, against the local MariaDB: a dedicated database and user with a password,
// the pool created (port 3306 → mysql) and given its role through the Control API, checked directly.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import mysql from 'mysql2/promise';
import { Pool } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { MYSQL, mysqlAccount, needServer } from './helpers/servers.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { DbUpstreams } from '../src/db/upstream.js';

const suffix = randomBytes(4).toString('hex');
const USER = `sqlhttp_${suffix}`;
const DB = `sqlhttp_${suffix}`;
const PASSWORD = 'secret-Pa55';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const root = await mysqlAccount(t, { db: DB, user: USER, password: PASSWORD });
  const direct = await mysql.createConnection({ ...MYSQL, database: DB });
  t.teardown(() => direct.end());

  const svc: TestService = await startTestService({ overrides: { dbAllowInsecure: true, accessLogFile: '/dev/null' } });
  t.teardown(() => svc.close());
  const boot = await svc.bootstrap();
  const created = await svc.api('POST', '/api/v1/pools/database', { token: boot.token, body: { db_host: 'localhost', db_port: 3306, db_name: DB } });
  const sub: string = created.body.data.subdomain;
  const poolId: number = created.body.data.id;
  // postgres_role is the method of every database pool's role, MySQL included.
  const attached = await svc.api('PUT', `/api/v1/pools/${sub}/credential`, {
    token: boot.token,
    body: { method: 'postgres_role', username: USER, password: PASSWORD },
  });
  const writeKey: string = (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token: boot.token, body: { label: 'w' } })).body.data.key;
  const readKey: string = (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token: boot.token, body: { label: 'r', access: 'read' } })).body.data.key;
  const dp = svc.service.dataplane!;
  await dp.snapshots.reload();

  const http = new Pool(svc.proxyUrl!, { connections: 32 });
  t.teardown(() => http.close());
  const host = `${sub}.pools.localhost`;
  const sql = async (body: unknown, o: { key?: string | null; method?: 'POST' | 'GET'; headers?: Record<string, string>; signal?: AbortSignal } = {}) => {
    const headers: Record<string, string> = { host, 'content-type': 'application/json', ...o.headers };
    const key = o.key === undefined ? writeKey : o.key;
    if (key !== null) headers['x-service-key'] = key;
    const res = await http.request({ path: '/', method: o.method ?? 'POST', headers, body: body === undefined ? undefined : JSON.stringify(body), signal: o.signal });
    const text = await res.body.text();
    return { status: res.statusCode, headers: res.headers, body: text ? JSON.parse(text) : null };
  };
  const setPool = async (maxConcurrent: number, settings: Record<string, unknown>) => {
    await svc.service.sql.query('UPDATE pools SET max_concurrent = $1, settings = $2 WHERE id = $3', [maxConcurrent, JSON.stringify(settings), poolId]);
    await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${poolId}`);
    await dp.snapshots.reload();
  };
  const processes = async () => {
    const [rows] = await root.query('SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE USER = ?', [USER]);
    return Number((rows as Array<{ n: number }>)[0]!.n);
  };
  const sleepers = async () => {
    const [rows] = await root.query(`SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE USER = ? AND COMMAND = 'Query' AND INFO LIKE '%SLEEP(%'`, [USER]);
    return Number((rows as Array<{ n: number }>)[0]!.n);
  };

  t.test('a port 3306 pool is a mysql pool; its role is attached as postgres_role', async (t) => {
    t.equal(created.status, 201);
    t.equal(created.body.data.backend, 'mysql');
    t.equal(attached.status, 200);
  });

  t.test('column values round-trip as JSON that holds them exactly', async (t) => {
    const setup = await sql({
      queries: [
        {
          query: `CREATE TABLE typed (id INT AUTO_INCREMENT PRIMARY KEY, big BIGINT, dec30 DECIMAL(30,3), dbl DOUBLE, flag TINYINT(1),
                  name VARCHAR(20), body TEXT, bin VARBINARY(8), blobby BLOB, at DATETIME(6), stamp TIMESTAMP(3) NULL, day DATE,
                  tod TIME, doc JSON, bits BIT(8), nothing VARCHAR(5))`,
        },
        {
          query: 'INSERT INTO typed (big, dec30, dbl, flag, name, body, bin, blobby, at, stamp, day, tod, doc, bits, nothing) VALUES (?, ?, ?, ?, ?, ?, UNHEX(?), UNHEX(?), ?, ?, ?, ?, ?, b\'10100101\', ?)',
          params: ['9007199254740993', '123456789012345678901234567.125', 1.5, true, "it's", 'héllo', '0102FF', '00', '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.250', '2024-02-29', '12:34:56', { a: [1, null] }, null],
        },
      ],
    });
    t.equal(setup.status, 200, setup.status === 200 ? 'created' : JSON.stringify(setup.body));
    t.equal(setup.body.results[1].lastInsertId, '1');
    t.equal(setup.body.results[1].rowCount, 1);
    const r = await sql({ query: 'SELECT big, dec30, dbl, flag, name, body, bin, blobby, at, stamp, day, tod, doc, bits, nothing FROM typed WHERE id = ?', params: [1] });
    t.equal(r.status, 200);
    t.same(r.body.columns.map((c: { type: string }) => c.type), [
      'bigint', 'decimal', 'double', 'tinyint', 'varchar', 'text', 'varbinary', 'blob', 'datetime', 'timestamp', 'date', 'time',
      // MariaDB stores JSON as LONGTEXT and reports it so; MySQL reports json.
      r.body.columns[12].type === 'json' ? 'json' : 'text', 'bit', 'varchar',
    ]);
    const row = r.body.rows[0];
    t.strictSame(row.slice(0, 12), [
      '9007199254740993', '123456789012345678901234567.125', 1.5, 1, "it's", 'héllo', Buffer.from([1, 2, 255]).toString('base64'),
      Buffer.from([0]).toString('base64'), '2024-01-02T03:04:05.123456', '2024-01-02T03:04:05.250Z', '2024-02-29', '12:34:56',
    ]);
    t.same(typeof row[12] === 'string' ? JSON.parse(row[12]) : row[12], { a: [1, null] }, 'json holds the document');
    t.equal(row[13], 0b10100101, 'BIT as an unsigned integer');
    t.equal(row[14], null);
  });

  t.test('a batch commits; a failing batch rolls back whole', async (t) => {
    const ok = await sql({
      queries: [
        { query: 'CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20) NOT NULL) ENGINE=InnoDB' },
        { query: 'INSERT INTO items VALUES (?, ?), (?, ?)', params: [1, 'one', 2, 'two'] },
      ],
    });
    t.equal(ok.status, 200);
    t.equal(ok.body.results[1].rowCount, 2);
    const failing = await sql({
      queries: [
        { query: 'INSERT INTO items VALUES (?, ?)', params: [10, 'ten'] },
        { query: 'UPDATE items SET name = ? WHERE id = 1', params: ['changed'] },
        { query: 'INSERT INTO items VALUES (?, ?)', params: [2, 'duplicate'] },
      ],
    });
    t.equal(failing.status, 409);
    t.match(failing.body, { error: 'database_error', code: '1062', sqlstate: '23000', index: 2 });
    const [rows] = await direct.query('SELECT id, name FROM items ORDER BY id');
    t.same(rows, [{ id: 1, name: 'one' }, { id: 2, name: 'two' }], 'nothing of the failing batch remains');
  });

  t.test('database errors carry their errno', async (t) => {
    t.match(await sql({ query: 'SELEC 1' }), { status: 400, body: { error: 'database_error', code: '1064' } });
    t.match(await sql({ query: 'SELECT * FROM no_such_table' }), { status: 400, body: { code: '1146' } });
    t.match(await sql({ query: 'INSERT INTO items VALUES (3, NULL)' }), { status: 409, body: { code: '1048' } });
    t.match(await sql({ query: 'SELECT 1; SELECT 2' }), { status: 400, body: { code: '1064' } }, 'one statement per query');
    t.match(await sql({ query: 'CREATE DATABASE other_db_of_nobody' }), { status: 403, body: { code: '1044' } }, 'refused by the database');
  });

  t.test('read and write keys connect as the same user; no key is 401; only POST', async (t) => {
    const w = await sql({ query: 'SELECT CURRENT_USER() AS u' });
    const r = await sql({ query: 'SELECT CURRENT_USER() AS u' }, { key: readKey });
    t.match(w.body.rows[0][0], new RegExp(`^${USER}@`));
    t.strictSame(r.body.rows, w.body.rows);
    t.equal((await sql({ query: 'SELECT 1' }, { key: null })).status, 401);
    const get = await sql(undefined, { method: 'GET' });
    t.equal(get.status, 405);
    t.equal(get.headers.allow, 'POST');
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
    const all = await Promise.all(Array.from({ length: 6 }, () => sql({ query: 'SELECT SLEEP(0.3)' })));
    sampling = false;
    await sampler;
    t.same(all.map((r) => r.status), [200, 200, 200, 200, 200, 200], JSON.stringify(all.map((r) => r.body.message ?? null)));
    t.equal(peak, 2, 'two statements at a time, never more');
    t.ok((await processes()) <= 2, 'the upstream connection pool holds at most max_concurrent connections');
  });

  t.test('a query past requestTimeoutMs is killed, answered 504, and its slot released', async (t) => {
    await setPool(1, { requestTimeoutMs: 400 });
    const started = performance.now();
    const r = await sql({ query: 'SELECT SLEEP(5)' });
    t.equal(r.status, 504);
    t.equal(r.body.error, 'upstream_timeout');
    t.ok(performance.now() - started < 2500, 'answered near the deadline');
    let left = 1;
    for (let i = 0; i < 100 && left > 0; i++) {
      left = await sleepers();
      if (left > 0) await new Promise((r) => setTimeout(r, 10));
    }
    t.equal(left, 0, 'KILL QUERY stopped it on the database');
    t.equal((await sql({ query: 'SELECT 1' }, { headers: { 'x-service-no-queue': '1' } })).status, 200, 'the slot is free');
    await setPool(2, {});
  });

  t.test('a client that disconnects cancels its query', async (t) => {
    const ctl = new AbortController();
    const pending = sql({ query: 'SELECT SLEEP(5)' }, { signal: ctl.signal }).catch((err: Error) => err);
    for (let i = 0; i < 100 && (await sleepers()) === 0; i++) await new Promise((r) => setTimeout(r, 10));
    t.equal(await sleepers(), 1, 'running');
    ctl.abort();
    t.type(await pending, Error);
    let left = 1;
    for (let i = 0; i < 100 && left > 0; i++) {
      await new Promise((r) => setTimeout(r, 10));
      left = await sleepers();
    }
    t.equal(left, 0, 'killed on the database');
  });

  t.test('a lone START TRANSACTION never leaks into the next request', async (t) => {
    await setPool(1, {});
    t.equal((await sql({ query: 'START TRANSACTION' })).status, 200);
    t.equal((await sql({ query: 'INSERT INTO items VALUES (60, ?)', params: ['autocommit'] })).status, 200);
    const [rows] = await direct.query('SELECT COUNT(*) AS n FROM items WHERE id = 60');
    t.equal(Number((rows as Array<{ n: number }>)[0]!.n), 1, 'committed at once');
    await setPool(4, {});
  });

  t.test('every connection re-checks the address it dials (allowPrivateTargets off: loopback refused)', async (t) => {
    const guarded = new DbUpstreams({ allowInsecure: true, allowPrivate: false, log: svc.service.log });
    t.teardown(() => guarded.close());
    const pool = dp.snapshots.current.pools.get(sub)!;
    const r = await guarded.run(pool, [{ query: 'SELECT 1', params: [] }], { timeoutMs: 5000, transaction: false });
    t.match(r, { ok: false, failure: { kind: 'unreachable', message: /loopback, private/ } });
  });

  t.test('no connection leak after 500 requests', async (t) => {
    let failures = 0;
    const work = async (n: number) => {
      for (let i = 0; i < n; i++) {
        const kind = i % 4;
        const r =
          kind === 0 ? await sql({ query: 'SELECT ? AS i', params: [i] })
          : kind === 1 ? await sql({ query: 'SELEC broken' })
          : kind === 2 ? await sql({ queries: [{ query: 'SELECT 1' }, { query: 'SELECT * FROM nope' }] })
          : await sql({ queries: [{ query: 'SELECT 1' }, { query: 'SELECT 2' }] }, { key: readKey });
        if (![200, 400].includes(r.status)) failures++;
      }
    };
    await Promise.all(Array.from({ length: 10 }, () => work(50)));
    t.equal(failures, 0);
    const open = await processes();
    t.ok(open <= 4, `at most max_concurrent connections stay open (${open})`);
    t.equal(dp.governor.state(poolId).inFlight, 0, 'every slot released');
  });
}
