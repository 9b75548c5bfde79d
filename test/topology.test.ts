// Issue 20 item 10: the distributed topology of examples/compose.yaml, run here as real processes of bin/poolgate.js —
// one `control`, two `dataplane` nodes and one `worker` on one fresh PostgreSQL database and the local Redis — shows
//   (a) one pool's max_concurrent held across both data plane nodes: 6 concurrent requests split over the nodes reach
//       the origin at most 2 at a time (the rest wait in the queue, the spec's default, and are then served), and
//   (b) a job accepted (202) on one data plane node is run by the worker and delivered to the webhook receiver.
// The shared Redis has no key prefix setting: a database index of its own keeps this test's pool ids (1, 2, … in a
// fresh store) away from other tests' keys.
import t from 'tap';
import { once } from 'node:events';
import { createHash } from 'node:crypto';
import { fromRoot } from '../src/config/paths.js';
import { request } from 'undici';
import { binArgv, spawnListening, type Listening } from './helpers/process.js';
import { freshPostgresDatabase } from './helpers/postgres-database.js';
import { startOrigin } from './helpers/origin.js';
import { startReceiver } from './helpers/receiver.js';
import { REDIS_URL } from './helpers/servers.js';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { until } from './helpers/until.js';

const ROOT = fromRoot();
const TOPOLOGY_REDIS = `${REDIS_URL}/13`;


t.test('compose topology as processes: one limit over two data plane nodes; a job accepted on one node delivered by the worker', async (t) => {
  const db = await freshPostgresDatabase();
  const origin = await startOrigin();
  const receiver = await startReceiver();
  const children: Listening[] = [];
  t.teardown(async () => {
    // Every child stops (SIGTERM, then SIGKILL after 10 s) before the database is dropped.
    await Promise.all(children.map(async ({ child }) => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = once(child, 'exit');
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    }));
    await origin.close();
    await receiver.close();
    await db.drop();
  });

  // What examples/config/distributed.env sets, with this machine's addresses, free ports and the test CAs.
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    POOLGATE_HOST: '127.0.0.1',
    DATABASE_URL: db.url,
    REDIS_URL: TOPOLOGY_REDIS,
    POOLGATE_SECRET_KEY: createHash('sha256').update(db.url).digest('hex'),
    POOLGATE_GOVERNOR_FAILURE_POLICY: 'closed',
    POOLGATE_LOG_FORMAT: 'json',
    POOLGATE_CONTROL_PORT: '0', POOLGATE_PROXY_PORT: '0', POOLGATE_LOCK_PORT: '0', POOLGATE_METRICS_PORT: '0',
    POOLGATE_PG_PORT: '0', POOLGATE_MYSQL_PORT: '0',
    POOLGATE_ALLOW_PRIVATE_TARGETS: 'true',
    POOLGATE_ORIGIN_CA_FILE: origin.caFile,
    POOLGATE_WEBHOOK_CA_FILE: receiver.caFile,
  };
  delete env.POOLGATE_CONFIG;
  const start = async (role: string) => {
    const l = await spawnListening(binArgv(role), { cwd: ROOT, env, timeoutMs: 40_000, name: role });
    children.push(l);
    return l;
  };
  // The control process migrates the store; the others start on it.
  const startedAt = Date.now();
  const control = await start('control');
  const [node1, node2, worker] = await Promise.all([start('dataplane'), start('dataplane'), start('worker')]);
  t.ok(worker.child.pid, 'the worker runs');
  t.comment(`four processes listening after ${Date.now() - startedAt} ms`);
  const controlUrl = `http://127.0.0.1:${control.listening.control as number}`;
  const proxies = [node1, node2].map((n) => `http://127.0.0.1:${n.listening.proxy as number}`);

  const admin = promisify(execFile)(process.execPath, binArgv('admin', 'bootstrap', '--team', 'Topology', '--email', 'ops@example.test', '--plan', 'team'), { cwd: ROOT, env });
  const { token } = JSON.parse((await admin).stdout) as { token: string };
  const api = async (method: 'GET' | 'POST' | 'PATCH', path: string, body?: unknown) => {
    const res = await request(`${controlUrl}${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: res.statusCode, body: (await res.body.json()) as any };
  };

  const pool = await api('POST', '/api/v1/pools', { origin: origin.url });
  t.equal(pool.status, 201, 'pool created on the control process');
  const sub = pool.body.data.subdomain as string;
  t.equal((await api('PATCH', `/api/v1/pools/${sub}/settings`, { max_concurrent: 2 })).status, 200);
  const key = (await api('POST', `/api/v1/pools/${sub}/keys`)).body.data.key as string;
  const call = (proxy: string, path: string, headers: Record<string, string> = {}) =>
    request(`${proxy}${path}`, { headers: { 'x-service-pool': sub, 'x-service-key': key, ...headers } });

  // Both nodes learn the pool (and its limit of 2) from the store's change feed.
  for (const proxy of proxies) {
    await until(`the pool on ${proxy}`, async () => {
      const res = await call(proxy, '/ready');
      await res.body.dump();
      return res.statusCode === 200 && res.headers['x-service-effective-limit'] === '2';
    });
  }

  await t.test('(a) max_concurrent 2 held across both nodes', async (t) => {
    origin.reset();
    const started = Date.now();
    const results = await Promise.all(Array.from({ length: 6 }, async (_, i) => {
      const res = await call(proxies[i % 2]!, '/delay/400');
      return { status: res.statusCode, body: await res.body.text() };
    }));
    const elapsed = Date.now() - started;
    t.same(results.map((r) => r.status), [200, 200, 200, 200, 200, 200], 'all six served: the ones over the limit waited in the queue');
    t.equal(origin.count, 6, 'six requests reached the origin');
    t.equal(origin.workingPeak, 2, 'never more than 2 at the origin at once, and the limit is used');
    t.ok(elapsed >= 1100, `three rounds of 400 ms, not one per node (${elapsed} ms)`);
  });

  await t.test('(b) a job accepted on node 1 is run and delivered by the worker', async (t) => {
    const hook = await api('POST', '/api/v1/webhooks', { name: 'topology', url: `${receiver.url}/hook`, pool_ids: [pool.body.data.id] });
    t.equal(hook.status, 201, 'destination attached (turns async on)');
    // Node 1 serves synchronously until the change feed brings it the destination: each try has a path of its own.
    let tries = 0;
    const res = await until('202 from node 1', async () => {
      const path = `/job-${++tries}`;
      const r = await call(proxies[0]!, path, { 'x-service-async': 'true' });
      const body = await r.body.text();
      return r.statusCode === 202 ? { path, body: JSON.parse(body) as any } : null;
    });
    t.match(res.body, { status: 'queued', reason: 'requested' }, 'accepted as a job');
    const [delivery] = await receiver.waitFor('/hook', 1, 20_000);
    const event = JSON.parse(delivery!.rawBody.toString()) as any;
    t.match(event, { id: res.body.id, type: 'async.job.completed' }, 'the worker delivered this job\'s completed event');
    t.equal(origin.requests.filter((r) => r.url === res.path).length, 1, 'the job ran once at the origin');
  });

  for (const c of children) t.equal(c.child.exitCode, null, `${c.listening.roles ?? 'process'} still running`);
});
