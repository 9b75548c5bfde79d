// With the Redis governor every acquire is answered after a round trip (a promise), yet only a request that
// really sat in the wait queue counts as queued: in /metrics (poolgate_pool_queued_total) and in the pool
// metrics summary (queued_count), for proxy requests and lock acquires alike (issue #4).
import t from 'tap';
import type { ChildProcess } from 'node:child_process';
import { Pool } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { metricSum } from './helpers/metrics.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { until } from './helpers/until.js';
import { needServer } from './helpers/servers.js';
import { freePort, startRedisServer } from './helpers/redis-server.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';

if (await needServer('redis')) {
  t.pass('skipped: no redis-server');
  process.exit(0);
}

let redis: ChildProcess;
let origin: Origin;
let svc: TestService;
let proxy: Pool;
let lock: Pool;
let token: string;
let teamId: number;

t.before(async () => {
  // A private Redis: pool ids of this test's database cannot meet another test's keys.
  const port = await freePort();
  redis = await startRedisServer(port);
  origin = await startOrigin();
  svc = await startTestService({ overrides: { redisUrl: `redis://127.0.0.1:${port}`, originCaFile: origin.caFile, accessLogFile: '/dev/null' } });
  const boot = await svc.bootstrap();
  token = boot.token;
  teamId = boot.team.id;
  proxy = new Pool(svc.proxyUrl!, { connections: 8 });
  lock = new Pool(svc.lockUrl!, { connections: 8 });
});
t.teardown(async () => {
  await proxy?.close();
  await lock?.close();
  await svc?.close();
  await origin?.close();
  redis?.kill('SIGKILL');
});

const dp = () => svc.service.dataplane!;

/** One slot, a queue of one, a fixed limit; returns the pool id and a key. */
async function createPool(sub: string, originUrl: string): Promise<{ id: number; key: string }> {
  const { rows } = await svc.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, $2, $2, 'http', $3, $4, 1, true, $5::jsonb) RETURNING id`,
    [teamId, sub, originUrl, new URL(originUrl).host, JSON.stringify({ queueLength: 1, queueTimeoutMs: 10_000, adaptive: false })],
  );
  await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await dp().snapshots.reload();
  const minted = await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token, body: {} });
  await dp().snapshots.reload();
  return { id: rows[0]!.id, key: minted.body.data.key as string };
}

async function call(sub: string, path: string, headers: Record<string, string>): Promise<number> {
  const res = await proxy.request({ path, method: 'GET', headers: { host: `${sub}.pools.localhost`, ...headers } });
  await res.body.dump();
  return res.statusCode;
}

async function post(path: string, key: string, body?: string): Promise<{ status: number; json: any }> {
  const res = await lock.request({ path, method: 'POST', headers: { 'x-service-key': key }, body });
  return { status: res.statusCode, json: JSON.parse(await res.body.text()) };
}

const sample = (name: string, labels: Record<string, string>) => metricSum(svc.metricsUrl!, name, labels);

t.test('proxy: requests admitted at once are not queued; the one that waited for a slot is', async (t) => {
  const { id, key } = await createPool('rq', origin.url);
  const auth = { 'x-service-key': key };
  const state = () => dp().governor.state(id);

  // Three requests one after another: each may wait (the pool's queue timeout), none has to.
  for (let i = 0; i < 3; i++) t.equal(await call('rq', '/', auth), 200);

  // A holds the only slot; B waits in the queue, then is admitted.
  const a = call('rq', '/delay/400', auth);
  await until('A in flight', () => state().inFlight === 1);
  const b = call('rq', '/', auth);
  await until('B waiting', () => state().queued === 1);
  t.equal(await a, 200, 'A');
  t.equal(await b, 200, 'B, admitted after waiting');

  // D holds the slot; E asks not to queue and is refused at once.
  const d = call('rq', '/delay/300', auth);
  await until('D in flight', () => state().inFlight === 1);
  t.equal(await call('rq', '/', { ...auth, 'x-service-no-queue': '1' }), 429, 'E: no slot, no queue');
  t.equal(await d, 200, 'D');

  t.equal(await sample('poolgate_pool_admitted_total', { pool: 'rq' }), 6, 'six admitted');
  t.equal(await sample('poolgate_pool_queued_total', { pool: 'rq' }), 1, 'only B counts as queued');
  const wait = await sample('poolgate_pool_queue_wait_seconds_sum', { pool: 'rq' });
  t.ok(wait > 0.1, `the queue wait is B's (${wait.toFixed(3)} s)`);

  await svc.service.rollups!.flush();
  const res = await svc.api('GET', '/api/v1/pools/rq/metrics', { token });
  t.equal(res.status, 200);
  t.match(res.body.data ?? res.body, { requests: 7, admitted: 6, queued_count: 1 }, 'summary: one of seven queued');
});

t.test('lock API: a grant that did not wait is not queued; an acquire that timed out in the queue is', async (t) => {
  const { key } = await createPool('lq', 'https://origin.example');
  const g = await post('/pools/lq/lock/acquire', key, '{"waitMs":5000}');
  t.equal(g.status, 200, 'granted at once, though it would have waited');
  t.equal((await post('/pools/lq/lock/acquire', key)).status, 429, 'no slot, no wait: refused');
  t.equal((await post('/pools/lq/lock/acquire', key, '{"waitMs":150}')).status, 504, 'waited, timed out');
  t.same((await post(`/pools/lq/lock/${g.json.slotId}/release`, key, '{"status":200}')).json, { released: true });

  t.equal(await sample('poolgate_pool_admitted_total', { pool: 'lq' }), 1, 'one grant');
  t.equal(await sample('poolgate_pool_queued_total', { pool: 'lq' }), 1, 'only the acquire that waited counts as queued');

  await svc.service.rollups!.flush();
  const summary = await svc.api('GET', '/api/v1/pools/lq/metrics', { token });
  t.equal(summary.status, 200);
  t.match(summary.body.data ?? summary.body, { requests: 3, admitted: 1, queued_count: 1 }, 'summary: one of three queued');
});
