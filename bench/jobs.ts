// Async jobs benchmark (one run, side by side): the same pool and origin path, sync requests vs
// `X-Service-Async: true` spills (202 after the INSERT), then how fast the runner drains the spilled jobs.
// Run: npx tsx bench/jobs.ts  (embedded store; BENCH_ENGINE=postgres for a fresh local PostgreSQL database;
// --write-results rewrites its jobs-<engine> section of bench/RESULTS.md).
import autocannon from 'autocannon';
// @ts-expect-error plain ESM helper without types
import { writeJobsResults } from './lib/jobs-results.mjs';
import { loadavg } from 'node:os';
import { startTestService } from '../test/helpers/service.js';
import { startOrigin } from '../test/helpers/origin.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';

const DURATION = Number(process.env.BENCH_SECONDS ?? 5);
const CONNECTIONS = 32;

const origin = await startOrigin();
const engine = process.env.BENCH_ENGINE === 'postgres' ? 'postgres' : 'pglite';
const svc = await startTestService({ engine, overrides: { originCaFile: origin.caFile, webhookCaFile: origin.caFile, accessLogSample: 0 } });
try {
  const boot = await svc.bootstrap({ plan: 'team' });
  const { rows } = await svc.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, async_enabled)
     VALUES ($1, 'bench', 'bench', 'http', $2, $3, 64, false, true) RETURNING id`,
    [boot.team.id, origin.url, new URL(origin.url).host],
  );
  await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  // The destination is the origin itself (it answers 200): one that refuses would be deactivated after 8 failures,
  // and the pool, left without an active destination, would serve the rest of the spill run synchronously.
  const dest = await svc.api('POST', '/api/v1/webhooks', { token: boot.token, body: { name: 'bench', url: `${origin.url}/h`, pool_ids: [rows[0]!.id] } });
  if (dest.status !== 201) throw new Error(`webhook destination: ${dest.status} ${JSON.stringify(dest.body)}`);
  await svc.service.dataplane!.snapshots.reload();
  const host = `bench.${svc.config.poolDomain}`;

  const run = async (title: string, headers: Record<string, string>) => {
    const r = await autocannon({ url: `${svc.proxyUrl}/x`, connections: CONNECTIONS, duration: DURATION, headers: { host, ...headers } });
    return { title, rps: Math.round(r.requests.average), p50: r.latency.p50, p99: r.latency.p99, accepted: r.statusCodeStats?.['202']?.count ?? 0, requests: r.requests.total, non2xx: r.non2xx, errors: r.errors };
  };
  const sync = await run('sync request (async pool, no header)', {});
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
  writeJobsResults('jobs', 'Async jobs', 'The same https pool and origin path (a 64-slot pool, key not required), first as sync requests, then with `X-Service-Async: true` (202 once the job is committed); deliveries go to the origin, on the same machine.', report);
} finally {
  await svc.close();
  await origin.close();
}
