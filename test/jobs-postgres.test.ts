// Async jobs on PostgreSQL with two runners on one store: the service (all roles) and a separate worker
// process's runner (startService with roles ['worker']), both on the Redis governor. Claims use FOR UPDATE
// SKIP LOCKED, so each job is run once; both runners take part; together they stay within the pool's cap.
import t from 'tap';
import { Pool } from 'undici';
import { needServer, REDIS_URL } from './helpers/servers.js';
import { startTestService, type TestService } from './helpers/service.js';
import { startReceiver, type Receiver } from './helpers/receiver.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { startService, type Service } from '../src/service.js';
import { createLogger } from '../src/log.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { until } from './helpers/until.js';

const JOBS = 200;

t.test('two runners on one PostgreSQL store run every job exactly once', async (t) => {
  const skip = (await needServer('postgres')) || (await needServer('redis'));
  if (skip) return t.skip(skip);
  const origin: Origin = await startOrigin();
  t.teardown(() => origin.close());
  // Deliveries are not what this test is about, but they must succeed: a destination that fails 8 times in a row
  // is deactivated, and the data plane (told at once) then serves the pool's async requests synchronously.
  const receiver: Receiver = await startReceiver();
  t.teardown(() => receiver.close());
  const svc: TestService = await startTestService({ engine: 'postgres', overrides: { originCaFile: origin.caFile, accessLogSample: 0, redisUrl: REDIS_URL, webhookCaFile: receiver.caFile } });
  t.teardown(() => svc.close());
  // A second process in all but name: its own store connections, snapshot, governor and runner.
  const worker: Service = await startService({ config: svc.config, roles: ['worker'], log: createLogger('silent') });
  t.teardown(() => worker.close());

  const boot = await svc.bootstrap({ plan: 'team' });
  const sql = svc.service.sql;
  const { rows } = await sql.query<{ id: number }>(
    // A pool id no other run uses: Redis governor keys are per pool id and Redis is shared.
    `INSERT INTO pools (id, team_id, name, subdomain, backend, origin, origin_host, max_concurrent)
     VALUES ($4, $1, 'pg-jobs', 'pg-jobs', 'http', $2, $3, 8) RETURNING id`,
    [boot.team.id, origin.url, new URL(origin.url).host, 1_000_000 + Math.floor(Math.random() * 1_000_000_000)],
  );
  const poolId = rows[0]!.id;
  await sql.notify(CHANGE_CHANNEL, `pool:${poolId}`);
  const hook = await svc.api('POST', '/api/v1/webhooks', { token: boot.token, body: { name: 'pg-hook', url: `${receiver.url}/hook`, pool_ids: [poolId] } });
  t.equal(hook.status, 201);
  const key = (await svc.api('POST', '/api/v1/pools/pg-jobs/keys', { token: boot.token, body: {} })).body.data.key as string;
  await svc.service.dataplane!.snapshots.reload();

  origin.reset();
  const proxy = new Pool(svc.proxyUrl!, { connections: 16 });
  t.teardown(() => proxy.close());
  const ids: string[] = [];
  const refused: number[] = [];
  await Promise.all(
    Array.from({ length: 16 }, async (_, w) => {
      for (let i = w; i < JOBS; i += 16) {
        const res = await proxy.request({
          path: `/delay/20?job=${i}`,
          method: 'GET',
          headers: { host: `pg-jobs.${svc.config.poolDomain}`, 'x-service-key': key, 'x-service-async': 'true' },
        });
        const body = (await res.body.json()) as { id: string };
        if (res.statusCode === 202) ids.push(body.id);
        else refused.push(res.statusCode);
      }
    }),
  );
  t.same(refused, [], 'every request was accepted as a job');
  await until('every job completed', async () => (await sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM jobs WHERE status = 'completed'`)).rows[0]!.n === JOBS, 40_000, 100);
  const calls = new Map<string, number>();
  for (const r of origin.requests) {
    const job = new URL(r.url, 'https://x').searchParams.get('job')!;
    calls.set(job, (calls.get(job) ?? 0) + 1);
  }
  t.equal(calls.size, JOBS, 'every job reached the origin');
  t.ok(origin.peak <= 8, `the two runners shared the pool's cap of 8 through Redis (peak ${origin.peak})`);
  t.ok([...calls.values()].every((n) => n === 1), 'no job was run twice');
  t.ok(worker.jobs!.started > 0 && svc.service.jobs!.started > 0, `both runners took jobs (${svc.service.jobs!.started} + ${worker.jobs!.started})`);
  // A job's row says completed once its outcome is written; its runner lets go of it just after.
  await until('both runners idle', () => worker.jobs!.inFlight === 0 && svc.service.jobs!.inFlight === 0);
  const attempts = await sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM jobs WHERE attempts <> 1`);
  t.equal(attempts.rows[0]!.n, 0, 'one attempt each');

  // The sweep on PostgreSQL: a lapsed lease (a runner that died) and a job past its TTL.
  const row = (id: string, status: string, extra: string) =>
    sql.query(
      `INSERT INTO jobs (id, pool_id, reason, status, method, path, headers, client_address, attempts, claim_token, lease_until, expires_at)
       VALUES ($1, $2, 'requested', $3, 'GET', '/delay/1', '{}'::jsonb, '127.0.0.1', ${extra})`,
      [id, poolId, status],
    );
  const lapsedId = `job_${'L'.repeat(43)}`;
  const lateId = `job_${'E'.repeat(43)}`;
  await row(lapsedId, 'running', `1, 'gone', now() - interval '1 second', now() + interval '1 hour'`);
  await row(lateId, 'queued', `0, NULL, NULL, now() - interval '1 second'`);
  let states: Record<string, string> = {};
  await until(() => `the sweep (${JSON.stringify(states)})`, async () => {
    const r = await sql.query<{ id: string; status: string }>('SELECT id, status FROM jobs WHERE id = ANY($1)', [[lapsedId, lateId]]);
    states = Object.fromEntries(r.rows.map((x) => [x.id, x.status]));
    return states[lapsedId] === 'completed' && states[lateId] === 'expired';
  }, 30_000, 100);
  t.same(states, { [lapsedId]: 'completed', [lateId]: 'expired' }, 'a lapsed lease is run again; a job past its TTL expires');
});
