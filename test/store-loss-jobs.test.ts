// Issue 27 item 3, the jobs side: async jobs accepted before the PostgreSQL store is SIGKILLed, and the webhook
// deliveries of their events, are not lost. The jobs are in flight at the origin when the store goes away; their
// results and events are written once it is back, and every job ends completed with its event delivered,
// without a restart of poolgate.
import t from 'tap';
import { request } from 'undici';
import { spawnSync } from 'node:child_process';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { needServer } from './helpers/servers.js';
import { startTestService } from './helpers/service.js';
import { startOrigin } from './helpers/origin.js';
import { startReceiver } from './helpers/receiver.js';
import { startPostgresServer } from './helpers/postgres-server.js';
import { when } from './helpers/failover-load.js';

const skip = (await needServer('postgres')) || (spawnSync('initdb', ['--version']).status === 0 ? false : 'no initdb on this machine');
const JOBS = 6;

t.test('accepted async jobs and their deliveries survive the store lost and back', { skip }, async (t) => {
  const pg = await startPostgresServer();
  t.teardown(() => pg.stop());
  const origin = await startOrigin();
  t.teardown(() => origin.close());
  origin.reset();
  const receiver = await startReceiver();
  t.teardown(() => receiver.close());
  const svc = await startTestService({
    overrides: { databaseUrl: pg.url, originCaFile: origin.caFile, webhookCaFile: receiver.caFile, accessLogFile: '/dev/null' },
    jobs: { retryBaseMs: 20, random: () => 0.5 },
  });
  t.teardown(() => svc.close());
  const { token, team } = await svc.bootstrap();
  const { rows } = await svc.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, 'jobs', 'jobs', 'http', $2, $3, 10, false, '{}'::jsonb) RETURNING id`,
    [team.id, origin.url, new URL(origin.url).host],
  );
  await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  // An active destination turns async on for the pool.
  const hook = await svc.api('POST', '/api/v1/webhooks', { token, body: { name: 'store-loss', url: `${receiver.url}/hook`, pool_ids: [rows[0]!.id] } });
  t.equal(hook.status, 201, JSON.stringify(hook.body));
  await svc.service.dataplane!.snapshots.reload();

  // Accepted while the store is up; each is still at the origin (1.5 s) when the store is killed.
  const accepted: Array<{ id: string; poll_url: string }> = [];
  for (let i = 0; i < JOBS; i++) {
    const res = await request(`${svc.proxyUrl}/delay/1500?job=${i}`, { headers: { host: 'jobs.pools.localhost', 'x-service-async': 'true' } });
    const body = (await res.body.json()) as { id: string; poll_url: string };
    t.equal(res.statusCode, 202, `job ${i} accepted`);
    accepted.push(body);
  }
  await when(async () => origin.active >= 1, 5000);
  pg.kill();
  const control = () => svc.api('GET', '/api/v1/pools', { token });
  t.ok(await when(async () => (await control()).status === 503, 10_000), 'the store is away (the Control API says 503)');
  // The jobs' origin calls end during the outage: their results cannot be written yet.
  t.ok(await when(async () => origin.active === 0, 20_000), 'the origin calls ended while the store is away');
  await pg.start();
  t.ok(await when(async () => (await control()).status === 200, 20_000), 'the store is back');

  const terminal = new Map<string, string>();
  const settledAll = await when(async () => {
    for (const job of accepted) {
      if (terminal.has(job.id)) continue;
      const res = await request(job.poll_url);
      const body = (await res.body.json().catch(() => null)) as { status?: string } | null;
      if (body?.status && ['completed', 'failed', 'expired'].includes(body.status)) terminal.set(job.id, body.status);
    }
    return terminal.size === JOBS;
  }, 60_000);
  if (!settledAll) {
    for (const job of accepted) {
      const res = await request(job.poll_url);
      t.comment(`${job.id}: ${res.statusCode} ${(await res.body.text()).slice(0, 300)}`);
    }
  }
  t.ok(settledAll, `every accepted job reached a terminal status (${terminal.size} of ${JOBS})`);
  t.same([...terminal.values()], Array(JOBS).fill('completed'), 'all of them completed');
  // The answers in hand when the store went away were stored once it came back, not dropped: no request ran twice.
  t.equal(origin.count, JOBS, `the origin saw each job once (${origin.count} requests for ${JOBS} jobs)`);

  await receiver.waitFor('/hook', JOBS, 60_000);
  const bodies = receiver.received.filter((r) => r.path === '/hook').map((r) => r.rawBody.toString());
  // Deliveries are at least once (the spec): a job's event may come twice, never not at all.
  for (const job of accepted) t.ok(bodies.some((b) => b.includes(job.id)), `job ${job.id}'s event was delivered`);
  t.comment(JSON.stringify({ jobs: JOBS, deliveries: bodies.length }));
});
