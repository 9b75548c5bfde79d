// Async jobs on database pools, against the local PostgreSQL: a SQL request becomes a job exactly as on an
// http pool (by header, when busy, after a timed-out wait), the runner runs the stored body, the event
// reaches a real https receiver with detail.kind 'database' and the rows, and polling returns the result.
// Also: the live gauges of a database pool on /metrics.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { Pool, request } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { startReceiver, type Receiver } from './helpers/receiver.js';
import { needServer, PG_URL } from './helpers/servers.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { RESULT_BODY_CAP } from '../src/jobs/job-limits.js';
import { soak } from './helpers/soak.js';
import { until } from './helpers/until.js';

/**
 * The runner's limits here: the result cap is the default 8 MiB in the soak run (test/soak/jobs-database.test.ts)
 * and 512 KiB in the default suite (above the 256 KiB inline limit, so the same paths run); the retry base
 * is 20 ms with no jitter (the default is 1 s, 4 s).
 */
const RESULT_CAP = soak(RESULT_BODY_CAP, 512 * 1024);
const JOBS_TUNING = { resultBodyCap: RESULT_CAP, retryBaseMs: 20, random: () => 0.5 };

const suffix = randomBytes(4).toString('hex');
const ROLE = `jobsdb_role_${suffix}`;
const DB = `jobsdb_db_${suffix}`;
const PASSWORD = 'secret-Pa55';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  await admin.query(`CREATE ROLE ${ROLE} LOGIN PASSWORD '${PASSWORD}'`);
  // One database per pool: the Control API reuses the live pool of a database it already has.
  const DBS = [DB, `${DB}_busy`, `${DB}_wait`, `${DB}_sync`];
  for (const d of DBS) await admin.query(`CREATE DATABASE ${d} OWNER ${ROLE}`);
  t.teardown(async () => {
    for (const d of DBS) await admin.query(`DROP DATABASE IF EXISTS ${d} WITH (FORCE)`);
    await admin.query(`DROP ROLE IF EXISTS ${ROLE}`);
    await admin.end();
  });

  const receiver: Receiver = await startReceiver();
  t.teardown(() => receiver.close());
  const svc: TestService = await startTestService({ overrides: { dbAllowInsecure: true, accessLogFile: '/dev/null', webhookCaFile: receiver.caFile }, jobs: JOBS_TUNING });
  t.teardown(() => svc.close());
  const boot = await svc.bootstrap({ plan: 'team' });
  const dp = svc.service.dataplane!;
  const http = new Pool(svc.proxyUrl!, { connections: 16 });
  t.teardown(() => http.close());

  /** A database pool with its role, a key and (unless told otherwise) a destination, which turns async on. */
  const createPool = async (o: { db?: string; port?: number; maxConcurrent?: number; asyncOnQueue?: boolean; destination?: boolean } = {}) => {
    const created = await svc.api('POST', '/api/v1/pools/database', { token: boot.token, body: { db_host: 'localhost', db_port: o.port ?? 5432, db_name: o.db ?? DB } });
    if (created.status !== 201) throw new Error(`pool create failed: ${created.status} ${JSON.stringify(created.body)}`);
    const sub: string = created.body.data.subdomain;
    const id: number = created.body.data.id;
    await svc.api('PUT', `/api/v1/pools/${sub}/credential`, { token: boot.token, body: { method: 'postgres_role', username: ROLE, password: PASSWORD } });
    await svc.service.sql.query('UPDATE pools SET max_concurrent = $1, async_on_queue = $2 WHERE id = $3', [o.maxConcurrent ?? 4, o.asyncOnQueue ?? false, id]);
    await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${id}`);
    const path = `/hook-${sub}`;
    if (o.destination !== false) {
      const hook = await svc.api('POST', '/api/v1/webhooks', { token: boot.token, body: { name: `hook-${sub}`, url: `${receiver.url}${path}`, pool_ids: [id] } });
      if (hook.status !== 201) throw new Error(`webhook create failed: ${hook.status} ${JSON.stringify(hook.body)}`);
    }
    const key: string = (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token: boot.token, body: {} })).body.data.key;
    await dp.snapshots.reload();
    return { sub, id, key, path };
  };

  const sql = async (p: { sub: string; key: string }, body: unknown, headers: Record<string, string> = {}) => {
    const res = await http.request({
      path: '/',
      method: 'POST',
      headers: { host: `${p.sub}.${svc.config.poolDomain}`, 'content-type': 'application/json', 'x-service-key': p.key, ...headers },
      body: JSON.stringify(body),
    });
    const text = await res.body.text();
    return { status: res.statusCode, headers: res.headers, body: text ? JSON.parse(text) : null };
  };
  const get = async (url: string, key: string) => {
    const res = await request(url, { headers: { 'x-service-key': key } });
    const text = await res.body.text();
    return { status: res.statusCode, headers: res.headers, text, json: JSON.parse(text) };
  };
  /** The envelope the receiver got for a job. */
  const eventOf = (path: string, jobId: string, timeoutMs = 15_000): Promise<any> =>
    until(`the event for ${jobId}`, () => receiver.received.filter((r) => r.path === path).map((r) => JSON.parse(r.rawBody.toString('utf8'))).find((env) => env.id === jobId), timeoutMs, 50);

  const main = await createPool();

  t.test('X-Service-Async: true turns a query into a job; the event carries the columns and rows', async (t) => {
    const r = await sql(main, { query: 'SELECT 1 AS a, $1::text AS b', params: ['x'] }, { 'x-service-async': 'true' });
    t.equal(r.status, 202);
    t.match(r.body, { status: 'queued', reason: 'requested' });
    t.equal(r.headers['x-service-job-id'], r.body.id);
    const env = await eventOf(main.path, r.body.id);
    t.equal(env.type, 'async.job.completed');
    t.same(env.detail, { kind: 'database', status: 200, command: 'SELECT', rowCount: 1, columns: [{ name: 'a', type: 'integer' }, { name: 'b', type: 'text' }], rows: [[1, 'x']] });

    const polled = await get(r.body.poll_url, main.key);
    t.equal(polled.status, 200);
    t.match(polled.json, { status: 'completed', reason: 'requested', attempts: 1, error: null });
    t.same(polled.json.result.data, { command: 'SELECT', rowCount: 1, columns: [{ name: 'a', type: 'integer' }, { name: 'b', type: 'text' }], rows: [[1, 'x']] });
    const raw = await get(r.body.result_url, main.key);
    t.equal(raw.status, 200);
    t.match(raw.headers['content-type'], /application\/json/);
    t.same(raw.json.rows, [[1, 'x']], 'the result address serves the same JSON the sync endpoint would');
  });

  t.test('a queries batch: the event carries results, and the batch ran in one transaction', async (t) => {
    const r = await sql(
      main,
      { queries: [{ query: 'CREATE TABLE IF NOT EXISTS t (n int)' }, { query: 'INSERT INTO t VALUES (1), (2)' }, { query: 'SELECT n FROM t ORDER BY n' }] },
      { 'x-service-async': 'yes' },
    );
    t.equal(r.status, 202);
    const env = await eventOf(main.path, r.body.id);
    t.equal(env.detail.kind, 'database');
    t.equal(env.detail.results.length, 3);
    t.same(env.detail.results[2].rows, [[1], [2]]);
    t.equal(env.detail.results[1].rowCount, 2);
  });

  t.test('a database error completes the job (the database answered) with the error in detail', async (t) => {
    const r = await sql(main, { query: 'SELECT 1 / 0' }, { 'x-service-async': 'true' });
    t.equal(r.status, 202);
    const env = await eventOf(main.path, r.body.id);
    t.equal(env.type, 'async.job.completed');
    t.match(env.detail, { kind: 'database', status: 400, error: { error: 'database_error', code: '22012' } });
    const polled = await get(r.body.poll_url, main.key);
    t.match(polled.json, { status: 'completed', attempts: 1, result: { status: 400, data: { error: { code: '22012' } } } });
  });

  t.test('a malformed body is refused at once, never stored as a job', async (t) => {
    const r = await sql(main, { query: '' }, { 'x-service-async': 'true' });
    t.equal(r.status, 400);
    t.equal(r.body.error, 'bad_request');
  });

  t.test('a result over 256 KiB is delivered as resultUrl', async (t) => {
    const r = await sql(main, { query: "SELECT repeat('x', 1000) AS s FROM generate_series(1, 400)" }, { 'x-service-async': 'true' });
    t.equal(r.status, 202);
    const env = await eventOf(main.path, r.body.id);
    t.same(Object.keys(env.detail).sort(), ['kind', 'resultUrl', 'status']);
    t.equal(env.detail.resultUrl, r.body.result_url);
    const polled = await get(r.body.poll_url, main.key);
    t.notOk('data' in polled.json.result, 'not inlined in the poll answer either');
    const raw = await get(env.detail.resultUrl, main.key);
    t.equal(raw.json.rows.length, 400);
    t.equal(raw.json.rows[0][0].length, 1000);
  });

  t.test('a result over the result cap is stored cut and marked truncated', async (t) => {
    // One row of 100 kB more than the cap holds, in 100 kB strings.
    const rows = Math.ceil(RESULT_CAP / 100_000) + 1;
    const r = await sql(main, { query: `SELECT repeat('y', 100000) AS s FROM generate_series(1, ${rows})` }, { 'x-service-async': 'true' });
    t.equal(r.status, 202);
    const env = await eventOf(main.path, r.body.id);
    t.same(env.detail, { kind: 'database', status: 200, resultUrl: r.body.result_url, truncated: true });
    const res = await request(r.body.result_url, { headers: { 'x-service-key': main.key } });
    const bytes = Buffer.from(await res.body.arrayBuffer());
    t.equal(res.headers['x-service-job-truncated'], 'true');
    t.equal(bytes.length, RESULT_CAP);
    const polled = await get(r.body.poll_url, main.key);
    t.match(polled.json.result, { status: 200, truncated: true });
    t.notOk('data' in polled.json.result);
  });

  t.test('busy: with async_on_queue and no free slot the query becomes a job; live gauges on /metrics', async (t) => {
    const p = await createPool({ db: `${DB}_busy`, maxConcurrent: 1, asyncOnQueue: true });
    const holding = sql(p, { query: 'SELECT pg_sleep(0.8)' });
    await until('the slot to be held', () => dp.governor.state(p.id).inFlight === 1);
    const text = await (await fetch(`${svc.metricsUrl}/metrics`)).text();
    const gauge = (name: string) => Number(new RegExp(`^${name}\\{pool="${p.sub}"\\} (\\S+)$`, 'm').exec(text)?.[1]);
    t.equal(gauge('poolgate_pool_in_flight'), 1, 'the database pool has an in-flight gauge');
    t.equal(gauge('poolgate_pool_queue_length'), 0);
    t.equal(gauge('poolgate_pool_effective_limit'), 1);
    const r = await sql(p, { query: 'SELECT 2 AS n' });
    t.equal(r.status, 202);
    t.equal(r.body.reason, 'busy');
    t.equal((await holding).status, 200);
    const env = await eventOf(p.path, r.body.id);
    t.same(env.detail.rows, [[2]]);
  });

  t.test('wait_timeout: a sync wait that times out becomes a job; the queue gauge counts the waiter', async (t) => {
    const p = await createPool({ db: `${DB}_wait`, maxConcurrent: 1 });
    const holding = sql(p, { query: 'SELECT pg_sleep(0.8)' });
    await until('the slot to be held', () => dp.governor.state(p.id).inFlight === 1);
    const waiting = sql(p, { query: 'SELECT 3 AS n' }, { 'x-service-queue-timeout-ms': '300' });
    await until('the request to queue', () => dp.governor.state(p.id).queued === 1);
    const text = await (await fetch(`${svc.metricsUrl}/metrics`)).text();
    t.match(text, new RegExp(`^poolgate_pool_queue_length\\{pool="${p.sub}"\\} 1$`, 'm'));
    const r = await waiting;
    t.equal(r.status, 202);
    t.equal(r.body.reason, 'wait_timeout');
    t.equal((await holding).status, 200);
    t.same((await eventOf(p.path, r.body.id)).detail.rows, [[3]]);
  });

  t.test('a pool without an active destination serves the query synchronously', async (t) => {
    const p = await createPool({ db: `${DB}_sync`, destination: false });
    const r = await sql(p, { query: 'SELECT 4 AS n' }, { 'x-service-async': 'true' });
    t.equal(r.status, 200);
    t.same(r.body.rows, [[4]]);
  });

  t.test('connection trouble is retried, then the job fails', async (t) => {
    // Nothing listens on port 1: every attempt is refused before a session exists.
    const p = await createPool({ port: 1 });
    const r = await sql(p, { query: 'SELECT 1' }, { 'x-service-async': 'true' });
    t.equal(r.status, 202);
    const env = await eventOf(p.path, r.body.id, 20_000);
    t.equal(env.type, 'async.job.failed');
    t.notOk('detail' in env);
    const polled = await get(r.body.poll_url, p.key);
    t.match(polled.json, { status: 'failed', attempts: 3, result: null, error: /database/ });
  });
}
