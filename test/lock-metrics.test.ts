// Lock API acquires are counted like proxy requests: each attempt once in poolgate_lock_acquires_total by
// outcome, governor answers in the admitted / queued / rejected totals, and in the pool metrics summary.
import t from 'tap';
import { Pool } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { metricSum } from './helpers/metrics.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';

let svc: TestService;
let lock: Pool;
let token: string;
let teamId: number;

t.before(async () => {
  svc = await startTestService();
  const boot = await svc.bootstrap();
  token = boot.token;
  teamId = boot.team.id;
  lock = new Pool(svc.lockUrl!, { connections: 8 });
});
t.teardown(async () => {
  await lock?.close();
  await svc?.close();
});

async function post(path: string, key: string | null, body?: string): Promise<{ status: number; json: any }> {
  const headers: Record<string, string> = {};
  if (key) headers['x-service-key'] = key;
  const res = await lock.request({ path, method: 'POST', headers, body });
  return { status: res.statusCode, json: JSON.parse(await res.body.text()) };
}

const sample = (name: string, labels: Record<string, string>) => metricSum(svc.metricsUrl!, name, labels);

t.test('each acquire attempt is counted once by outcome, and in the summary like a proxy request', async (t) => {
  const sql = svc.service.sql;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, 'lm', 'lm', 'http', 'https://origin.example', 'origin.example', 1, true, $2::jsonb) RETURNING id`,
    [teamId, JSON.stringify({ queueTimeoutMs: 5000 })],
  );
  await sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await svc.service.dataplane!.snapshots.reload();
  const minted = await svc.api('POST', '/api/v1/pools/lm/keys', { token, body: {} });
  const key = minted.body.data.key as string;
  await svc.service.dataplane!.snapshots.reload();

  const g = await post('/pools/lm/lock/acquire', key);
  t.equal(g.status, 200, 'granted');
  t.equal((await post('/pools/lm/lock/acquire', key)).status, 429, 'no slot, no wait: refused');
  t.equal((await post('/pools/lm/lock/acquire', key, '{"waitMs":150}')).status, 504, 'waited, timed out');
  t.equal((await post('/pools/lm/lock/acquire', 'sk_wrong')).status, 401, 'bad key');
  t.equal((await post('/pools/lm/lock/acquire', key, '{"waitMS":1}')).status, 400, 'bad body');
  await post(`/pools/lm/lock/${g.json.slotId}/renew`, key);
  await post(`/pools/lm/lock/${g.json.slotId}/release`, key, '{"status":200}');

  const acquires = (outcome: string) => sample('poolgate_lock_acquires_total', { pool: 'lm', outcome });
  t.equal(await acquires('granted'), 1, 'granted: 1');
  t.equal(await acquires('rejected_no_slot'), 1, 'rejected_no_slot: 1');
  t.equal(await acquires('queue_timeout'), 1, 'queue_timeout: 1');
  t.equal(await acquires('unauthorized'), 1, 'unauthorized: 1');
  t.equal(await acquires('bad_request'), 1, 'bad_request: 1');
  t.equal(await sample('poolgate_lock_acquires_total', { pool: 'lm' }), 5, 'renew and release are not acquires');
  t.equal(await sample('poolgate_pool_admitted_total', { pool: 'lm' }), 1, 'the grant counts as an admission');
  t.equal(await sample('poolgate_pool_rejected_total', { pool: 'lm', reason: 'no_slot' }), 1, 'the refusal by reason');
  t.equal(await sample('poolgate_pool_queued_total', { pool: 'lm' }), 1, 'the acquire that waited counts as queued');
  t.equal(await sample('poolgate_pool_requests_total', { pool: 'lm' }), 0, 'proxy request outcomes are not touched');

  await svc.service.rollups!.flush();
  const summary = await svc.api('GET', '/api/v1/pools/lm/metrics', { token });
  t.equal(summary.status, 200);
  t.equal(summary.body.requests, 3, 'summary: the three acquires that reached the governor');
  t.equal(summary.body.admitted, 1, 'summary: one admitted');
  t.equal(summary.body.queued_count, 1, 'summary: one queued');
});
