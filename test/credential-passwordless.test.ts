// Issue 20 item 4: a database role without a password (the usual local MariaDB root) can be attached as a database
// pool's credential — PUT /api/v1/pools/{pool}/credential with the username alone — and a client then connects
// through the MySQL wire listener (mysql2) and runs statements as that role; likewise a trust-auth PostgreSQL role
// through the PostgreSQL port (pg). The password stays required where the
// method needs one (basic), and a database pool's credential still needs its username.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import mysql from 'mysql2/promise';
import pg from 'pg';
import { MYSQL, PG_URL, needServer } from './helpers/servers.js';
import { startTestApi, startTestService } from './helpers/service.js';
import { freshPostgresDatabase } from './helpers/postgres-database.js';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  t.test('MariaDB root without a password, attached by username alone, works through the MySQL port', async (t) => {
    const db = `nopw_${randomBytes(4).toString('hex')}`;
    const root = await mysql.createConnection({ ...MYSQL });
    t.teardown(async () => {
      await root.query(`DROP DATABASE IF EXISTS \`${db}\``);
      await root.end();
    });
    await root.query(`CREATE DATABASE \`${db}\``);
    t.equal(MYSQL.password, '', 'the local root has no password');

    const svc = await startTestService({ overrides: { dbAllowInsecure: true, accessLogFile: '/dev/null' } });
    t.teardown(() => svc.close());
    const { token } = await svc.bootstrap();
    const created = await svc.api('POST', '/api/v1/pools/database', { token, body: { backend: 'mysql', db_host: '127.0.0.1', db_port: 3306, db_name: db } });
    t.equal(created.status, 201, JSON.stringify(created.body));
    const sub = created.body.data.subdomain as string;

    const noUser = await svc.api('PUT', `/api/v1/pools/${sub}/credential`, { token, body: { method: 'postgres_role', password: 'x' } });
    t.equal(noUser.status, 422, 'the username is still required');
    t.match(noUser.body.error?.message ?? JSON.stringify(noUser.body), /username/);

    const cred = await svc.api('PUT', `/api/v1/pools/${sub}/credential`, { token, body: { method: 'postgres_role', username: MYSQL.user } });
    t.equal(cred.status, 200, `attached without a password: ${JSON.stringify(cred.body)}`);
    t.equal((await svc.api('GET', `/api/v1/pools/${sub}`, { token })).body.data.has_credential, true);

    const key = (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token, body: { label: 'nopw' } })).body.data.key as string;
    await svc.service.dataplane!.snapshots.reload();
    const c = await mysql.createConnection({ host: '127.0.0.1', port: svc.service.ports.mysql!, user: sub, password: key, database: db });
    t.teardown(() => c.end().catch(() => {}));
    const [rows] = await c.query('SELECT CURRENT_USER() AS who, DATABASE() AS db, 6 * 7 AS answer');
    const row = (rows as Array<{ who: string; db: string; answer: number }>)[0]!;
    t.match(row.who, /^root@/, 'runs as root on MariaDB');
    t.equal(row.db, db);
    t.equal(Number(row.answer), 42);
    await c.query('CREATE TABLE t (id INT PRIMARY KEY)');
    await c.execute('INSERT INTO t VALUES (?)', [1]);
    const [back] = await root.query(`SELECT id FROM \`${db}\`.t`);
    t.same(back, [{ id: 1 }], 'the write reached MariaDB');
  });

  t.test('a PostgreSQL role under trust auth, attached by username alone, works through the PostgreSQL port', async (t) => {
    const db = await freshPostgresDatabase();
    t.teardown(() => db.drop());
    const role = decodeURIComponent(new URL(PG_URL).username);
    const dbName = new URL(db.url).pathname.slice(1);
    const svc = await startTestService({ overrides: { dbAllowInsecure: true, accessLogFile: '/dev/null' } });
    t.teardown(() => svc.close());
    const { token } = await svc.bootstrap();
    const created = await svc.api('POST', '/api/v1/pools/database', { token, body: { backend: 'postgres', db_host: '127.0.0.1', db_port: 5432, db_name: dbName } });
    t.equal(created.status, 201, JSON.stringify(created.body));
    const sub = created.body.data.subdomain as string;
    const cred = await svc.api('PUT', `/api/v1/pools/${sub}/credential`, { token, body: { method: 'postgres_role', username: role } });
    t.equal(cred.status, 200, `attached without a password: ${JSON.stringify(cred.body)}`);
    const key = (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token, body: { label: 'nopw' } })).body.data.key as string;
    await svc.service.dataplane!.snapshots.reload();
    const c = new pg.Client({ host: '127.0.0.1', port: svc.service.ports.pg!, database: 'anything', user: 'anyone', password: key, options: `pool=${sub}` });
    await c.connect();
    t.teardown(() => c.end().catch(() => {}));
    const r = await c.query('SELECT current_user AS who, current_database() AS db');
    t.same(r.rows, [{ who: role, db: dbName }], 'runs as the trust role in the pool database');
  });

  t.test('an http pool\'s basic credential still needs its password', async (t) => {
    const svc = await startTestApi();
    t.teardown(() => svc.close());
    const { token } = await svc.bootstrap();
    const pool = await svc.api('POST', '/api/v1/pools', { token, body: { origin: 'https://nopw.example.com' } });
    const res = await svc.api('PUT', `/api/v1/pools/${pool.body.data.subdomain}/credential`, { token, body: { method: 'basic', username: 'u' } });
    t.equal(res.status, 422);
    t.match(JSON.stringify(res.body), /password/);
  });
}
