// Proxy traffic reaches the Control API's metrics summary: requests admitted, queued and refused by the
// governor are counted per pool and minute in memory, flushed to the store, and summed by
// GET /api/v1/pools/{pool}/metrics. Requests stopped before the governor (no key) are not pool traffic.
import t from 'tap';
import { Pool } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { until } from './helpers/until.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { LATENCY_BOUNDS_MS } from '../src/domain/latency-buckets.js';

let origin: Origin;
let svc: TestService;
let proxy: Pool;
let token: string;
let teamId: number;

t.before(async () => {
  origin = await startOrigin();
  svc = await startTestService({ overrides: { originCaFile: origin.caFile, accessLogFile: '/dev/null' } });
  const boot = await svc.bootstrap();
  token = boot.token;
  teamId = boot.team.id;
  proxy = new Pool(svc.proxyUrl!, { connections: 16 });
});
t.teardown(async () => {
  await proxy?.close();
  await svc?.close();
  await origin?.close();
});

const dp = () => svc.service.dataplane!;

/** One slot, a queue of one, a fixed limit (no adaptive change while the test runs). */
async function createPool(sub: string): Promise<number> {
  const { rows } = await svc.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, $2, $2, 'http', $3, $4, 1, true, $5::jsonb) RETURNING id`,
    [teamId, sub, origin.url, new URL(origin.url).host, JSON.stringify({ queueLength: 1, queueTimeoutMs: 10_000, adaptive: false })],
  );
  await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await dp().snapshots.reload();
  return rows[0]!.id;
}

async function call(sub: string, path: string, headers: Record<string, string> = {}): Promise<number> {
  const res = await proxy.request({ path, method: 'GET', headers: { host: `${sub}.pools.localhost`, ...headers } });
  await res.body.dump();
  return res.statusCode;
}

t.test('admitted, queued and refused proxy requests show up in the pool metrics summary', async (t) => {
  const poolId = await createPool('rollups');
  const minted = await svc.api('POST', '/api/v1/pools/rollups/keys', { token, body: { label: 'rollups' } });
  t.equal(minted.status, 201);
  await dp().snapshots.reload();
  const auth = { 'x-service-key': minted.body.data.key as string };
  const state = () => dp().governor.state(poolId);

  // 5 admitted one after another.
  for (let i = 0; i < 5; i++) t.equal(await call('rollups', '/', auth), 200);

  // A holds the only slot; B waits in the queue (then is admitted); C finds the queue full (429).
  const aSent = performance.now();
  const a = call('rollups', '/delay/300', auth);
  await until('A in flight', () => state().inFlight === 1);
  const b = call('rollups', '/', auth);
  await until('B queued', () => state().queued === 1);
  // B queued by now and waits for A's slot, which comes free 300 ms after A was sent at the earliest: how long
  // B waited at least, however long this test took to see it queued (a loaded machine: 140 ms once).
  const bWaitedAtLeast = 300 - (performance.now() - aSent);
  t.equal(await call('rollups', '/', auth), 429, 'C: the queue is full');
  t.equal(await a, 200, 'A');
  t.equal(await b, 200, 'B, admitted after waiting');

  // D holds the slot; E waits 50 ms for it and gives up (504 queue_timeout): queued and refused.
  const d = call('rollups', '/delay/300', auth);
  await until('D in flight', () => state().inFlight === 1);
  t.equal(await call('rollups', '/', { ...auth, 'x-service-queue-timeout-ms': '50' }), 504, 'E: queue timeout');
  t.equal(await d, 200, 'D');

  // Stopped before the governor: not pool traffic for the summary.
  t.equal(await call('rollups', '/'), 401, 'no key');
  t.equal(await call('rollups', '/', { 'x-service-key': 'nope' }), 401, 'wrong key');

  await svc.service.rollups!.flush();
  const res = await svc.api('GET', '/api/v1/pools/rollups/metrics', { token });
  t.equal(res.status, 200);
  const m = res.body.data ?? res.body;
  // 5 + A + B + D admitted; C and E refused; B and E waited in the queue.
  t.match(m, { pool_id: poolId, requests: 10, admitted: 8, queued_count: 2 }, 'the summary counts every governed request once');
  t.equal(m.admit_rate, 0.8);
  t.equal(m.queued_pct, 20);

  // Issue 17's charts: the same minutes with queue wait and upstream latency p50/p95 and the effective limit.
  // B waited ~300 ms for A's slot; A and D spent 300 ms upstream; the rest took a few ms.
  const minutes = await svc.api('GET', '/api/v1/pools/rollups/metrics/minutes?window=1h', { token });
  t.equal(minutes.status, 200);
  const rows = minutes.body.data as any[];
  t.equal(rows.reduce((n, r) => n + r.requests, 0), 10, 'the minutes hold every governed request');
  t.equal(rows.reduce((n, r) => n + r.admitted, 0), 8);
  const top = rows.reduce((a, r) => (r.admitted > a.admitted ? r : a));
  t.ok(top.queue_wait_p50_ms !== null && top.queue_wait_p50_ms < 50, `queue wait p50 is small (${top.queue_wait_p50_ms} ms)`);
  // The p95 falls in B's bucket (the minute's few requests), so it is at least that bucket's lower bound.
  const floor = [...LATENCY_BOUNDS_MS].reverse().find((b) => b < bWaitedAtLeast) ?? 0;
  t.ok(floor >= 10, `B waited ${Math.round(bWaitedAtLeast)} ms at least (the test saw it queued in time to tell)`);
  t.ok(rows.some((r) => r.queue_wait_p95_ms >= floor), `B's wait shows in a p95 (${rows.map((r) => r.queue_wait_p95_ms)}; B waited >= ${Math.round(bWaitedAtLeast)} ms)`);
  t.ok(top.upstream_p50_ms !== null && top.upstream_p50_ms < 200, `upstream p50 is small (${top.upstream_p50_ms} ms)`);
  t.ok(rows.some((r) => r.upstream_p95_ms >= 200), `the 300 ms answers show in an upstream p95 (${rows.map((r) => r.upstream_p95_ms)})`);
  t.ok(rows.every((r) => r.effective_limit === 1), 'the effective limit sampled at flush time');
  t.equal(rows.reduce((n, r) => n + r.upstream_errors, 0), 0);

  // More traffic after a flush adds to the same minute's row; nothing is counted twice.
  for (let i = 0; i < 3; i++) t.equal(await call('rollups', '/', auth), 200);
  await svc.service.rollups!.flush();
  await svc.service.rollups!.flush();
  const again = await svc.api('GET', '/api/v1/pools/rollups/metrics', { token });
  const m2 = again.body.data ?? again.body;
  t.match(m2, { requests: 13, admitted: 11, queued_count: 2 }, 'a second flush adds only what came since');
});

t.test('a range that excludes the traffic reports none of it', async (t) => {
  const from = new Date(Date.now() + 3_600_000).toISOString();
  const res = await svc.api('GET', `/api/v1/pools/rollups/metrics?from=${encodeURIComponent(from)}`, { token });
  t.equal(res.status, 200);
  t.match(res.body.data ?? res.body, { requests: 0, admitted: 0, queued_count: 0 });
});
