// Lock clients that crash: 10,000 leases (soak run; 1,000 in the default suite) with a 200 ms term taken by clients that randomly vanish (never
// release, renew a few times then stop, or drop the connection mid-acquire), and waiters that give up in
// the queue. Every slot must come back: the governor shows zero in flight one term after the last renewal.
import t from 'tap';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { soak } from './helpers/soak.js';
import { sleep, until } from './helpers/until.js';

const TERM_MS = 200;
/** Leases taken by crashing clients: 10,000 in the soak run (test/soak/), 1,000 in the default suite. */
const LEASES = soak(10_000, 1_000);
const fmt = (n: number) => n.toLocaleString('en-US');
/** Timer and event-loop lateness allowed on a busy shared machine, beyond the term itself. */
const SLACK_MS = 400;
const logDir = mkdtempSync(join(tmpdir(), 'poolgate-lock-crash-'));
let svc: TestService;
let lock: Pool;
let teamId: number;
let token: string;

t.before(async () => {
  svc = await startTestService({ overrides: { accessLogFile: join(logDir, 'access.log') } });
  const boot = await svc.bootstrap();
  teamId = boot.team.id;
  token = boot.token;
  lock = new Pool(svc.lockUrl!, { connections: 64 });
});
t.teardown(async () => {
  await lock?.destroy();
  await svc?.close();
  rmSync(logDir, { recursive: true, force: true });
});

const governor = () => svc.service.dataplane!.governor;

async function createPool(sub: string, maxConcurrent: number, settings: Record<string, unknown>): Promise<{ id: number; key: string }> {
  const sql = svc.service.sql;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, $2, $3, 'http', 'https://127.0.0.1:9', '127.0.0.1:9', $4, true, $5::jsonb) RETURNING id`,
    [teamId, sub, sub, maxConcurrent, JSON.stringify(settings)],
  );
  await sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  const res = await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token, body: {} });
  await svc.service.dataplane!.snapshots.reload();
  return { id: rows[0]!.id, key: res.body.data.key };
}

async function post(path: string, key: string, body?: unknown, signal?: AbortSignal): Promise<{ status: number; json: any }> {
  const res = await lock.request({
    path,
    method: 'POST',
    headers: { 'x-service-key': key, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  const text = await res.body.text();
  return { status: res.statusCode, json: text ? JSON.parse(text) : null };
}

/** Runs `total` jobs with at most `width` at a time. */
async function each(total: number, width: number, job: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < total) await job(next++);
  }));
}

/** Polls until the pool shows nothing in flight; resolves with the ms it took, or -1 at the limit. */
async function untilFree(poolId: number, limitMs: number): Promise<number> {
  const started = performance.now();
  const free = await until(`pool ${poolId} to be free`, () => governor().state(poolId).inFlight === 0, limitMs, 5).catch(() => false);
  return free ? performance.now() - started : -1;
}

t.test(`${fmt(LEASES)} leases from crashing clients are all reclaimed one term after their last renewal`, async (t) => {
  const { id, key } = await createPool('crash', LEASES, { leaseTermMs: TERM_MS, renewIntervalMs: 50, requestTimeoutMs: 60_000, adaptive: false });
  let seed = 42;
  const random = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff);
  const counts = { granted: 0, crashed: 0, renewedThenCrashed: 0, released: 0, droppedMidAcquire: 0, refused: 0 };
  let peak = 0;
  let lastActivity = performance.now();
  const sampler = setInterval(() => (peak = Math.max(peak, governor().state(id).inFlight)), 5);
  const renewals: Array<Promise<void>> = [];
  const slotIds: string[] = [];

  // LEASES leases, plus LEASES / 20 acquires dropped on the wire interleaved among them (every 21st).
  await each(LEASES + LEASES / 20, 64, async (i) => {
    const fate = random();
    if (i % 21 === 20) {
      // The client dies while its acquire is on the wire: whatever the server did, nothing may leak.
      const ac = new AbortController();
      const p = post('/pools/crash/lock/acquire', key, undefined, ac.signal).catch(() => null);
      setImmediate(() => ac.abort());
      await p;
      counts.droppedMidAcquire++;
      lastActivity = performance.now();
      return;
    }
    const r = await post('/pools/crash/lock/acquire', key);
    lastActivity = performance.now();
    if (r.status !== 200) {
      counts.refused++;
      if (counts.refused === 1) t.comment(`first refusal: ${r.status} ${JSON.stringify(r.json)} at lease ${i}; ${JSON.stringify(governor().state(id))}`);
      return;
    }
    counts.granted++;
    const slotId: string = r.json.slotId;
    if (i % 97 === 0) slotIds.push(slotId);
    if (fate < 0.65) {
      counts.crashed++; // never renews, never releases
    } else if (fate < 0.9) {
      counts.renewedThenCrashed++;
      const times = 1 + Math.floor(random() * 3);
      renewals.push((async () => {
        for (let n = 0; n < times; n++) {
          await sleep(50);
          await post(`/pools/crash/lock/${slotId}/renew`, key);
          lastActivity = performance.now();
        }
      })());
    } else {
      counts.released++;
      await post(`/pools/crash/lock/${slotId}/release`, key, { status: 200 });
    }
  });
  await Promise.all(renewals);
  clearInterval(sampler);
  t.comment(JSON.stringify({ ...counts, peakInFlight: peak }));
  t.equal(counts.refused, 0, `the pool never ran out of its ${fmt(LEASES)} slots`);
  t.equal(counts.granted, LEASES, `${fmt(LEASES)} leases granted`);
  t.ok(peak > 1, `leases overlapped (peak ${peak} in flight)`);

  const sinceLast = performance.now() - lastActivity;
  const took = await untilFree(id, TERM_MS + SLACK_MS);
  t.not(took, -1, `every slot free within one term (+${SLACK_MS} ms slack) of the last activity; ${governor().state(id).inFlight} still held`);
  t.comment(`free ${Math.round(sinceLast + took)} ms after the last lease activity (term ${TERM_MS} ms)`);
  t.same(governor().state(id), { ...governor().state(id), inFlight: 0, queued: 0 }, 'zero in flight, nobody queued');
  for (const slotId of slotIds.slice(0, 20)) {
    t.equal((await post(`/pools/crash/lock/${slotId}/renew`, key)).status, 404, 'a reclaimed slot is not found');
  }
  const again = await post('/pools/crash/lock/acquire', key);
  t.equal(again.status, 200, 'the pool grants again');
  await post(`/pools/crash/lock/${again.json.slotId}/release`, key);
});

t.test('waiters that give up in the queue and holders that crash leave no slot behind', async (t) => {
  const { id, key } = await createPool('crash-queue', 20, { leaseTermMs: TERM_MS, queueTimeoutMs: 2000, queueLength: 1000, adaptive: false });
  let seed = 7;
  const random = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff);
  const outcomes: Record<string, number> = {};
  await Promise.all(Array.from({ length: 400 }, async () => {
    const ac = new AbortController();
    const gaveUp = random() < 0.5;
    if (gaveUp) setTimeout(() => ac.abort(), Math.floor(random() * 300));
    const r = await post('/pools/crash-queue/lock/acquire', key, { waitMs: 2000 }, ac.signal).catch(() => ({ status: 0, json: null }));
    const label = r.status === 0 ? 'gave_up' : String(r.status);
    outcomes[label] = (outcomes[label] ?? 0) + 1;
    // Granted holders crash too: half release, half vanish.
    if (r.status === 200 && random() < 0.5) await post(`/pools/crash-queue/lock/${r.json.slotId}/release`, key);
  }));
  t.comment(JSON.stringify(outcomes));
  t.ok((outcomes.gave_up ?? 0) > 50, 'many waiters gave up while queued');
  t.ok((outcomes['200'] ?? 0) > 20, 'slots were handed on from crashed holders to waiters');
  const took = await untilFree(id, TERM_MS + SLACK_MS);
  t.not(took, -1, 'every slot free one term after the last grant');
  t.equal(governor().state(id).queued, 0, 'no waiter left behind');
});
