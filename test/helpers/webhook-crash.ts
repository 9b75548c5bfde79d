// The deliverer's crash proof, shared by the small default test and the soak run: a separate worker
// process (`poolgate worker` on a PostgreSQL store) is killed with SIGKILL in the middle of a burst of
// deliveries, then started again; every event must reach each of its destinations at least once, at its own
// path, and every outbox row must end delivered. Attempts that were in flight at the kill come back when
// their claim lease ends (at-least-once), so duplicates are allowed and counted, losses are not.
import type { Test } from 'tap';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { once } from 'node:events';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fromRoot } from '../../src/config/paths.js';
import { enqueueJobEvent } from '../../src/webhooks/outbox.js';
import type { JobEvent } from '../../src/jobs/job-event.js';
import { startTestService } from './service.js';
import { startReceiver } from './receiver.js';
import { spawnListening } from './process.js';
import { until } from './until.js';

const ROOT = fromRoot();
const BIN = join(ROOT, 'bin', 'poolgate.js');


export async function crashMidBurst(t: Test, events: number, destinations: number, drainTimeoutMs: number): Promise<void> {
  const receiver = await startReceiver();
  t.teardown(() => receiver.close());
  const secretKey = randomBytes(32).toString('hex');
  const svc = await startTestService({ engine: 'postgres', roles: ['control'], overrides: { secretKey } });
  t.teardown(() => svc.close());
  const sql = svc.service.sql;
  const boot = await svc.bootstrap({ plan: 'team' });
  const sub = `crash-${randomBytes(3).toString('hex')}`;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, async_enabled)
     VALUES ($1, $2, $2, 'http', 'https://api.example.test', 'api.example.test', true) RETURNING id`,
    [boot.team.id, sub],
  );
  const poolId = rows[0]!.id;
  const pathOf = new Map<string, string>();
  for (let i = 0; i < destinations; i++) {
    const res = await svc.api('POST', '/api/v1/webhooks', { token: boot.token, body: { name: `d${i}`, url: `${receiver.url}/d${i}`, pool_ids: [poolId] } });
    if (res.status !== 201) throw new Error(`create webhook: ${res.status}`);
    pathOf.set(String(res.body.data.id), `/d${i}`);
  }

  const dataDir = mkdtempSync(join(tmpdir(), 'poolgate-webhook-crash-'));
  t.teardown(() => rmSync(dataDir, { recursive: true, force: true }));
  const env = {
    ...process.env,
    DATABASE_URL: svc.config.databaseUrl!,
    REDIS_URL: '',
    POOLGATE_SECRET_KEY: secretKey,
    POOLGATE_DATA_DIR: dataDir,
    POOLGATE_ALLOW_PRIVATE_TARGETS: 'true',
    POOLGATE_WEBHOOK_CA_FILE: receiver.caFile,
    // The shortest lease: rows claimed by the killed worker come back 6 s later.
    POOLGATE_WEBHOOK_CLAIM_LEASE_MS: '6000',
    // Not the default metrics port: another test's worker may hold it (this one would then exit at start).
    POOLGATE_METRICS_PORT: '0',
    POOLGATE_LOG_LEVEL: 'warn',
  };
  const worker = () => spawnListening([BIN, 'worker'], { cwd: ROOT, env, timeoutMs: 120_000, name: 'poolgate worker' });

  // The burst is in the outbox before the first worker starts.
  const jobs: string[] = [];
  for (let done = 0; done < events; ) {
    const n = Math.min(200, events - done);
    await sql.transaction(async (tx) => {
      for (let i = 0; i < n; i++) {
        const jobId = `job_${randomBytes(12).toString('hex')}`;
        jobs.push(jobId);
        const e: JobEvent = { jobId, poolId, poolHost: `${sub}.${svc.config.poolDomain}`, status: 'completed', reason: 'requested', createdAt: Date.now(), completedAt: Date.now() };
        await enqueueJobEvent(tx, e);
      }
    });
    done += n;
  }
  const want = events * destinations;
  const distinct = () => new Set(receiver.received.map((r) => `${r.headers['x-service-job-id']}|${r.headers['x-service-webhook-id']}`)).size;

  const first = await worker();
  t.teardown(() => first.child.exitCode === null && first.child.kill('SIGKILL'));
  await until('a third of the burst', () => receiver.received.length >= want / 3, drainTimeoutMs);
  first.child.kill('SIGKILL');
  await once(first.child, 'exit');
  const atKill = distinct();
  t.ok(atKill < want, `killed mid-burst: ${atKill} of ${want} deliveries had arrived`);

  const second = await worker();
  t.teardown(() => second.child.exitCode === null && second.child.kill('SIGKILL'));
  await until('every delivery after the restart', () => distinct() >= want, drainTimeoutMs);
  const got = new Map<string, number>();
  let misrouted = 0;
  for (const r of receiver.received) {
    const key = `${r.headers['x-service-job-id']}|${r.headers['x-service-webhook-id']}`;
    got.set(key, (got.get(key) ?? 0) + 1);
    if (pathOf.get(String(r.headers['x-service-webhook-id'])) !== r.path) misrouted++;
  }
  const missing = jobs.flatMap((j) => [...pathOf.keys()].filter((d) => !got.has(`${j}|${d}`)));
  t.equal(missing.length, 0, 'every event reached every destination at least once');
  t.equal(misrouted, 0, 'each delivery reached its own destination');
  const duplicates = receiver.received.length - got.size;
  t.comment(`${want} deliveries, ${duplicates} sent twice (in flight or unrecorded at the kill)`);

  // The store agrees once the second worker has recorded everything.
  await until('every row recorded', async () => {
    const { rows } = await sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM webhook_deliveries WHERE status <> 'delivered'`);
    return rows[0]!.n === 0;
  }, drainTimeoutMs);
  const stopped = once(second.child, 'exit');
  second.child.kill('SIGTERM');
  await stopped;
}
