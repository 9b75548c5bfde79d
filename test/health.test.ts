// Issue 20 item 1: liveness and readiness per role, without auth, on the control port and on the metrics port of
// every role (docs/operations.md): store reachable, snapshot loaded, governor backend reachable, listeners up.
import t from 'tap';
import { request } from 'undici';
import { startTestService } from './helpers/service.js';
import { needServer } from './helpers/servers.js';
import { freePort, startRedisServer } from './helpers/redis-server.js';
import { startService } from '../src/service.js';
import { createLogger } from '../src/log.js';
import { Health } from '../src/health.js';
import { until } from './helpers/until.js';

async function get(url: string): Promise<{ status: number; body: any }> {
  const res = await request(url);
  return { status: res.statusCode, body: await res.body.json() };
}

t.test('every role in one process: /livez, /readyz and /healthz answer without a token on both ports', async (t) => {
  const svc = await startTestService();
  t.teardown(() => svc.close());
  for (const base of [svc.controlUrl, svc.metricsUrl!]) {
    const live = await get(`${base}/livez`);
    t.equal(live.status, 200, `${base}/livez`);
    t.equal(live.body.status, 'ok');
    for (const path of ['/readyz', '/healthz']) {
      const ready = await get(`${base}${path}`);
      t.equal(ready.status, 200, `${base}${path}`);
      t.equal(ready.body.status, 'ok');
      t.same(ready.body.roles, ['control', 'dataplane', 'worker']);
      t.same(Object.keys(ready.body.checks).sort(), ['listeners', 'snapshot', 'store']);
      t.equal(ready.body.checks.store.ok, true);
      t.match(ready.body.checks.snapshot.detail, /^loaded \d+ s ago$/);
    }
  }
  // Other Control API paths still need a token.
  t.equal((await request(`${svc.controlUrl}/api/v1/me`)).statusCode, 401);
  // Not in the Control API's OpenAPI document (they are not part of /api/v1).
  const doc = (await (await request(`${svc.controlUrl}/api/v1/openapi.json`)).body.json()) as { paths: Record<string, unknown> };
  t.notOk(Object.keys(doc.paths).some((p) => p.endsWith('z')), 'health paths are not API operations');
});

t.test('a worker-only process answers the health paths on its metrics port', async (t) => {
  const skip = await needServer('postgres');
  if (skip) return t.skip(skip);
  const svc = await startTestService({ engine: 'postgres', roles: ['control'] });
  t.teardown(() => svc.close());
  const worker = await startService({ config: svc.config, roles: ['worker'], log: createLogger('silent') });
  t.teardown(() => worker.close());
  t.ok(worker.ports.metrics, 'the worker binds the metrics port');
  const ready = await get(`http://127.0.0.1:${worker.ports.metrics}/readyz`);
  t.equal(ready.status, 200);
  t.same(ready.body.roles, ['worker']);
  t.same(Object.keys(ready.body.checks).sort(), ['listeners', 'store', 'worker_snapshot']);
  const metrics = await request(`http://127.0.0.1:${worker.ports.metrics}/metrics`);
  t.equal(metrics.statusCode, 200);
  await metrics.body.text();
});

t.test('a data plane node whose Redis is gone is live but not ready (governorFailurePolicy closed), ready again when it is back', async (t) => {
  const skip = await needServer('postgres');
  if (skip) return t.skip(skip);
  const port = await freePort();
  let redis = await startRedisServer(port);
  t.teardown(() => redis.kill('SIGKILL'));
  const svc = await startTestService({ engine: 'postgres', overrides: { redisUrl: `redis://127.0.0.1:${port}` } });
  t.teardown(() => svc.close());
  const ready = await get(`${svc.metricsUrl}/readyz`);
  t.equal(ready.status, 200);
  t.same(ready.body.checks.governor, { ok: true, detail: 'redis', required: true });

  redis.kill('SIGKILL');
  await until('readyz 503', async () => (await get(`${svc.metricsUrl}/readyz`)).status === 503, 10_000);
  const down = await get(`${svc.metricsUrl}/readyz`);
  t.equal(down.body.status, 'failing');
  t.equal(down.body.checks.governor.ok, false);
  t.match(down.body.checks.governor.detail, /redis unreachable/);
  t.equal(down.body.checks.store.ok, true, 'the store is still reachable');
  t.equal((await get(`${svc.metricsUrl}/livez`)).status, 200, 'still live: a restart would not bring Redis back');

  redis = await startRedisServer(port);
  await until('readyz 200', async () => (await get(`${svc.metricsUrl}/readyz`)).status === 200, 15_000);
  t.pass('ready again once Redis answers');
});

t.test('readiness: starting and draining are not ready; a failing required check is; an optional one is reported only', async (t) => {
  const h = new Health(['dataplane'], { checkTimeoutMs: 100 });
  let up = true;
  h.add({ name: 'dep', required: true, run: () => ({ ok: up }) });
  h.add({ name: 'extra', required: false, run: () => ({ ok: false, detail: 'reported only' }) });
  h.add({ name: 'hung', required: false, run: () => new Promise(() => {}) });
  t.equal((await h.report()).status, 'starting');
  h.serving();
  const ok = await h.report();
  t.equal(ok.status, 'ok');
  t.match(ok.checks.hung, { ok: false, detail: /no answer within/ });
  up = false;
  t.equal((await h.report()).status, 'failing');
  up = true;
  h.draining();
  t.equal((await h.report()).status, 'draining');
});
