// Async jobs on a database pool (one run, side by side): the same PostgreSQL pool and query, sync SQL over
// HTTP vs `X-Service-Async: true` spills (202 after the INSERT), then how fast the runner drains the jobs.
// Run: npx tsx bench/jobs-database.ts  (embedded store; BENCH_ENGINE=postgres for a PostgreSQL store;
// --write-results rewrites its jobs-database-<engine> section of bench/RESULTS.md).
import autocannon from 'autocannon';
// @ts-expect-error plain ESM helper without types
import { writeJobsResults } from './lib/jobs-results.mjs';
import { randomBytes } from 'node:crypto';
import { loadavg } from 'node:os';
import pg from 'pg';
import { startTestService } from '../test/helpers/service.js';
import { PG_URL } from '../test/helpers/servers.js';
import { startOrigin } from '../test/helpers/origin.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';

const DURATION = Number(process.env.BENCH_SECONDS ?? 5);
const CONNECTIONS = 32;
const suffix = randomBytes(4).toString('hex');
const ROLE = `benchjobs_${suffix}`;
const DB = `benchjobs_${suffix}`;

const admin = new pg.Client({ connectionString: PG_URL });
await admin.connect();
await admin.query(`CREATE ROLE ${ROLE} LOGIN PASSWORD 'bench-Pa55'`);
await admin.query(`CREATE DATABASE ${DB} OWNER ${ROLE}`);
const engine = process.env.BENCH_ENGINE === 'postgres' ? 'postgres' : 'pglite';
// The webhook receiver: a destination that refuses would be deactivated after 8 failures, and the pool, left
// without an active destination, would serve the rest of the spill run synchronously.
const receiver = await startOrigin();
const svc = await startTestService({ engine, overrides: { dbAllowInsecure: true, webhookCaFile: receiver.caFile, accessLogSample: 0, accessLogFile: '/dev/null' } });
try {
  const boot = await svc.bootstrap({ plan: 'team' });
  const created = await svc.api('POST', '/api/v1/pools/database', { token: boot.token, body: { db_host: 'localhost', db_name: DB } });
  const sub: string = created.body.data.subdomain;
  const id: number = created.body.data.id;
  await svc.api('PUT', `/api/v1/pools/${sub}/credential`, { token: boot.token, body: { method: 'postgres_role', username: ROLE, password: 'bench-Pa55' } });
  await svc.service.sql.query('UPDATE pools SET max_concurrent = 16, require_key = false, async_enabled = true WHERE id = $1', [id]);
  await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${id}`);
  const dest = await svc.api('POST', '/api/v1/webhooks', { token: boot.token, body: { name: 'bench', url: `${receiver.url}/h`, pool_ids: [id] } });
  if (dest.status !== 201) throw new Error(`webhook destination: ${dest.status} ${JSON.stringify(dest.body)}`);
  await svc.service.dataplane!.snapshots.reload();
  const host = `${sub}.${svc.config.poolDomain}`;
  const body = JSON.stringify({ query: 'SELECT $1::int AS n, now() AS at', params: [7] });

  const run = async (title: string, headers: Record<string, string>) => {
    const r = await autocannon({ url: `${svc.proxyUrl}/`, method: 'POST', body, connections: CONNECTIONS, duration: DURATION, headers: { host, 'content-type': 'application/json', ...headers } });
    return { title, rps: Math.round(r.requests.average), p50: r.latency.p50, p99: r.latency.p99, accepted: r.statusCodeStats?.['202']?.count ?? 0, requests: r.requests.total, non2xx: r.non2xx, errors: r.errors };
  };
  const sync = await run('sync query (async pool, no header)', {});
  const spill = await run('async spill (X-Service-Async: true → 202)', { 'x-service-async': 'true' });
  const drainStart = performance.now();
  for (;;) {
    const q = await svc.service.sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM jobs WHERE status IN ('queued', 'running')`);
    if (q.rows[0]!.n === 0) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  const drainMs = performance.now() - drainStart;
  const done = await svc.service.sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM jobs WHERE status = 'completed'`);
  const report = { engine, load: loadavg().map((l) => l.toFixed(2)), connections: CONNECTIONS, seconds: DURATION, sync, spill, ratio: +(spill.rps / sync.rps).toFixed(2), drained: { jobs: done.rows[0]!.n, ms: Math.round(drainMs), jobsPerSecond: Math.round(done.rows[0]!.n / (drainMs / 1000)) } };
  console.log(JSON.stringify(report, null, 2));
  writeJobsResults('jobs-database', 'Async jobs on a database pool', 'The same PostgreSQL database pool (`max_concurrent` 16) and query (`SELECT $1::int AS n, now() AS at`), first as sync SQL over HTTP, then with `X-Service-Async: true` (202 once the job is committed); deliveries go to an https receiver on the same machine.', report);
} finally {
  await svc.close();
  await admin.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
  await admin.query(`DROP ROLE IF EXISTS ${ROLE}`);
  await admin.end();
  await receiver.close();
}
