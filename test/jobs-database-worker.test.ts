// Async jobs of a MariaDB pool run by a worker-only process: the service (control + data plane, no worker)
// spills the SQL request into a PostgreSQL store, a separate worker process — with no data plane, so with
// database connections of its own — runs it, and the event reaches a real https receiver.
import { until } from './helpers/until.js';
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { Pool, request } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { startReceiver, type Receiver } from './helpers/receiver.js';
import { mysqlAccount, needServer } from './helpers/servers.js';
import { startService, type Service } from '../src/service.js';
import { createLogger } from '../src/log.js';

const suffix = randomBytes(4).toString('hex');
const USER = `jobsdb_${suffix}`;
const DB = `jobsdb_${suffix}`;
const PASSWORD = 'secret-Pa55';

const skip = (await needServer('mariadb')) || (await needServer('postgres'));
if (skip) {
  t.skip(skip);
} else {
  await mysqlAccount(t, { db: DB, user: USER, password: PASSWORD });

  const receiver: Receiver = await startReceiver();
  t.teardown(() => receiver.close());
  const svc: TestService = await startTestService({
    engine: 'postgres',
    roles: ['control', 'dataplane'],
    overrides: { dbAllowInsecure: true, accessLogFile: '/dev/null', webhookCaFile: receiver.caFile },
  });
  t.teardown(() => svc.close());
  const worker: Service = await startService({ config: svc.config, roles: ['worker'], log: createLogger('silent') });
  t.teardown(() => worker.close());

  const boot = await svc.bootstrap({ plan: 'team' });
  const created = await svc.api('POST', '/api/v1/pools/database', { token: boot.token, body: { db_host: 'localhost', db_port: 3306, db_name: DB } });
  const sub: string = created.body.data.subdomain;
  const poolId: number = created.body.data.id;
  await svc.api('PUT', `/api/v1/pools/${sub}/credential`, { token: boot.token, body: { method: 'postgres_role', username: USER, password: PASSWORD } });
  await svc.api('POST', '/api/v1/webhooks', { token: boot.token, body: { name: 'mysql-hook', url: `${receiver.url}/hook`, pool_ids: [poolId] } });
  const key: string = (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token: boot.token, body: {} })).body.data.key;
  await svc.service.dataplane!.snapshots.reload();

  const http = new Pool(svc.proxyUrl!, { connections: 4 });
  t.teardown(() => http.close());
  const sql = async (body: unknown) => {
    const res = await http.request({
      path: '/',
      method: 'POST',
      headers: { host: `${sub}.${svc.config.poolDomain}`, 'x-service-key': key, 'x-service-async': 'true' },
      body: JSON.stringify(body),
    });
    return { status: res.statusCode, body: (await res.body.json()) as any };
  };
  const eventOf = (jobId: string): Promise<any> =>
    until(`the event for ${jobId}`, () => receiver.received.map((r) => JSON.parse(r.rawBody.toString('utf8'))).find((env) => env.id === jobId), 20_000, 50);

  t.test('the worker process runs a MariaDB batch and a single query', async (t) => {
    t.equal(created.body.data.backend, 'mysql');
    t.equal(svc.service.jobs, null, 'the service itself runs no jobs');
    const batch = await sql({
      queries: [
        { query: 'CREATE TABLE items (id INT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(20) UNIQUE)' },
        { query: 'INSERT INTO items (name) VALUES (?), (?)', params: ['a', 'b'] },
      ],
    });
    t.equal(batch.status, 202);
    const b = await eventOf(batch.body.id);
    t.equal(b.type, 'async.job.completed');
    t.equal(b.detail.kind, 'database');
    t.equal(b.detail.results[1].rowCount, 2);

    const one = await sql({ query: 'SELECT id, name FROM items ORDER BY id' });
    const e = await eventOf(one.body.id);
    t.match(e.detail, { kind: 'database', status: 200, command: 'SELECT', columns: [{ name: 'id' }, { name: 'name' }], rows: [[1, 'a'], [2, 'b']] });
    const polled = await request(one.body.poll_url, { headers: { 'x-service-key': key } });
    const view = (await polled.body.json()) as any;
    t.same(view.result.data.rows, [[1, 'a'], [2, 'b']], 'polling returns the rows');
    t.ok(worker.jobs!.started >= 2, 'the worker process ran them');
  });

  t.test('a duplicate key is the database answering: completed, 409 and errno in detail', async (t) => {
    const dup = await sql({ query: 'INSERT INTO items (name) VALUES (?)', params: ['a'] });
    const e = await eventOf(dup.body.id);
    t.equal(e.type, 'async.job.completed');
    t.match(e.detail, { kind: 'database', status: 409, error: { error: 'database_error', code: '1062' } });
  });
}
