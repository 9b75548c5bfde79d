// Receivers that misbehave (spec: Delivery semantics 1 — timeouts, TLS errors and non-2xx are failures): one
// that hangs, resets, redirects, answers 3xx/4xx/5xx, streams 1 GB back or is refused by the SSRF guard at
// send time. Each is recorded as the right failure, none stalls deliveries to a healthy receiver, and the
// process's memory stays flat.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { startTestService } from './helpers/service.js';
import { startReceiver, type Behaviour } from './helpers/receiver.js';
import { enqueueJobEvent } from '../src/webhooks/outbox.js';
import { Deliverer } from '../src/webhooks/deliverer.js';
import { createLogger } from '../src/log.js';
import type { JobEvent } from '../src/jobs/job-event.js';
import { until } from './helpers/until.js';
import { DrivenGovernorTime } from './helpers/test-clock.js';

const receiver = await startReceiver();
t.teardown(() => receiver.close());
// One attempt per delivery (then given up), so each recorded attempt is easy to name. The deliverer's send
// timeout runs on time the test drives: a hang ends when the test moves 5 s ahead, not after 5 s of waiting.
// The claim lease (real time, for crash recovery) is an hour, so a hang held on a slow machine is not claimed again.
const sendTime = new DrivenGovernorTime();
const svc = await startTestService({
  overrides: { webhookCaFile: receiver.caFile, webhookMaxAttempts: 1, webhookConcurrency: 16, webhookClaimLeaseMs: 3_600_000 },
  webhookTime: sendTime,
});
t.teardown(() => svc.close());
const sql = svc.service.sql;
const boot = await svc.bootstrap({ plan: 'team' });
const hex = (n: number) => randomBytes(n).toString('hex');

async function poolWithHook(path: string): Promise<{ pool: { id: number; host: string }; hookId: number }> {
  const subdomain = `p-${hex(4)}`;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, async_enabled)
     VALUES ($1, $2, $2, 'http', 'https://api.example.test', 'api.example.test', true) RETURNING id`,
    [boot.team.id, subdomain],
  );
  const res = await svc.api('POST', '/api/v1/webhooks', { token: boot.token, body: { name: `h-${hex(3)}`, url: `${receiver.url}${path}`, pool_ids: [rows[0]!.id] } });
  if (res.status !== 201) throw new Error(`create webhook: ${res.status}`);
  return { pool: { id: rows[0]!.id, host: `${subdomain}.${svc.config.poolDomain}` }, hookId: res.body.data.id };
}

const event = (pool: { id: number; host: string }): JobEvent => ({
  jobId: `job_${hex(8)}`,
  poolId: pool.id,
  poolHost: pool.host,
  status: 'completed',
  reason: 'busy',
  createdAt: Date.now() - 50,
  completedAt: Date.now(),
  detail: { kind: 'http', status: 200, headers: {}, body: 'done' },
});
const enqueue = (e: JobEvent) => sql.transaction((tx) => enqueueJobEvent(tx, e));

async function attempts(hookId: number) {
  const { rows } = await sql.query<{ result: string; http_status: number | null; error: string | null; latency_ms: number }>(
    'SELECT result, http_status, error, latency_ms FROM webhook_delivery_attempts WHERE webhook_endpoint_id = $1 ORDER BY id',
    [hookId],
  );
  return rows;
}


t.test('hang, reset, redirect, 3xx/4xx/5xx are failures; a healthy receiver is served meanwhile', async (t) => {
  const faults: Array<[string, Behaviour, RegExp, number | null]> = [
    ['/hang', 'hang', /timeout/, null],
    ['/reset', 'reset', /(ECONNRESET|socket|closed)/i, null],
    ['/redirect', 'redirect', /redirect not followed/, 302],
    ['/s301', { status: 301 }, /redirect not followed/, 301],
    ['/s404', { status: 404 }, /HTTP 404/, 404],
    ['/s410', { status: 410 }, /HTTP 410/, 410],
    ['/s500', { status: 500 }, /HTTP 500/, 500],
    ['/s503', { status: 503 }, /HTTP 503/, 503],
  ];
  const hooks = new Map<string, number>();
  for (const [path, b] of faults) {
    receiver.on(path, b);
    const { pool, hookId } = await poolWithHook(path);
    hooks.set(path, hookId);
    // Four deliveries each: the hanging receiver takes its whole per-destination share of slots.
    for (let i = 0; i < 4; i++) await enqueue(event(pool));
  }
  await receiver.waitFor('/hang', 4);
  const hangingNow = receiver.active;
  t.ok(hangingNow >= 4, `the hanging receiver holds requests open (${hangingNow} active)`);

  // While those hang (their timeout cannot pass: the test holds the deliverer's time), a healthy
  // destination's deliveries go through.
  const healthy = await poolWithHook('/healthy');
  for (let i = 0; i < 10; i++) await enqueue(event(healthy.pool));
  await receiver.waitFor('/healthy', 10);
  t.equal(receiver.received.filter((r) => r.path === '/hang').length, 4, 'the hanging receiver is still hanging');

  const recorded = async (path: string) => {
    const rows = await until(`${path} recorded`, async () => {
      const a = await attempts(hooks.get(path)!);
      return a.length === 4 && a;
    });
    for (const r of rows) {
      t.equal(r.result, 'failure', `${path}: failure`);
      t.equal(r.http_status, faults.find((f) => f[0] === path)![3], `${path}: status`);
      t.match(r.error, faults.find((f) => f[0] === path)![2], `${path}: ${r.error}`);
    }
    return rows;
  };
  for (const [path] of faults) if (path !== '/hang') await recorded(path);
  await until('the healthy deliveries recorded', async () => (await attempts(healthy.hookId)).length === 10);
  // Only the hanging sends are left, each with its timeout timer on the driven clock. Just short of the
  // timeout none ends (timers run inside advance()); at 5 s each hang fails.
  t.same(await attempts(hooks.get('/hang')!), [], 'no hanging delivery has ended');
  t.equal(sendTime.pending, 4, 'four send timeouts pending');
  sendTime.advance(4999);
  t.equal(sendTime.pending, 4, 'none has fired at 4,999 ms');
  sendTime.advance(1);
  t.equal(sendTime.pending, 0, 'all four fired at 5,000 ms');
  const hung = await recorded('/hang');
  t.ok(hung.every((r) => r.latency_ms === 5000), 'a hang fails at the 5 s timeout');
  t.equal(receiver.received.filter((r) => r.path === '/ok').length, 0, 'no redirect was followed');
  const { rows } = await sql.query<{ consecutive_failures: number }>('SELECT consecutive_failures FROM webhook_endpoints WHERE id = $1', [hooks.get('/s500')!]);
  t.equal(rows[0]!.consecutive_failures, 4, 'each failure counts toward the streak');
});

t.test('a receiver streaming 1 GB back: success on its 2xx, the body is not read, RSS stays flat', async (t) => {
  receiver.on('/huge', 'huge');
  const { pool, hookId } = await poolWithHook('/huge');
  const healthy = await poolWithHook('/healthy2');
  globalThis.gc?.();
  const before = process.memoryUsage().rss;
  for (let i = 0; i < 6; i++) await enqueue(event(pool));
  for (let i = 0; i < 6; i++) await enqueue(event(healthy.pool));
  // A positive signal with the usual limit: the huge answers' time is held (the driven clock), so a stall
  // would not end by itself, and the bytes the receiver could write are bounded below.
  await receiver.waitFor('/healthy2', 6);
  const rows = await until('6 huge deliveries recorded', async () => {
    const a = await attempts(hookId);
    return a.length === 6 && a;
  });
  t.ok(rows.every((r) => r.result === 'success' && r.http_status === 200), 'a 2xx answer within 5 s is a success');
  // Every huge answer has closed (the deliverer dropped its connection), so the receiver writes no more.
  await until('every huge answer cut off', () => receiver.active === 0);
  const grown = process.memoryUsage().rss - before;
  t.ok(receiver.hugeBytesWritten < 6 * 64 * 1024 * 1024, `the receiver could write only ${(receiver.hugeBytesWritten / 2 ** 20).toFixed(1)} MiB of 6 GiB`);
  t.ok(grown < 96 * 1024 * 1024, `RSS grew ${(grown / 2 ** 20).toFixed(1)} MiB`);
});

t.test('the SSRF guard runs again at send time: a destination now resolving to a private address is refused', async (t) => {
  const { pool, hookId } = await poolWithHook('/guarded');
  // A second deliverer whose policy refuses private addresses (the service's own allows them for tests).
  const guarded = new Deliverer({
    sql,
    box: svc.service.box,
    log: createLogger('silent'),
    targets: { allowPrivate: false, ownHosts: [], lookup: async () => ['10.0.0.7'] },
    caFile: receiver.caFile,
    retry: { baseMs: 120_000, capMs: 120_000, maxAttempts: 15 },
    leaseMs: 30_000,
    concurrency: 4,
    perDestination: 4,
    pollMs: 100,
  });
  const row = {
    id: '0', webhook_endpoint_id: hookId, job_id: 'job_x', pool_id: pool.id, event_type: 'async.job.completed',
    body: Buffer.from('{}'), body_sha256: '', attempts: 1, url: `https://moved.example.test/guarded`,
    signing_secret_enc: svc.service.box.seal('whsec_x'), auth_header: null, credential_enc: null,
  };
  const outcome = await guarded.send(row);
  await guarded.stop();
  t.match(outcome, { ok: false, status: null, error: /destination refused: .*private/ });
  t.equal(receiver.received.filter((r) => r.path === '/guarded').length, 0, 'nothing was sent');
});

t.test('connections resolve the name again and refuse a private answer (DNS rebinding after the check)', async (t) => {
  const { pool, hookId } = await poolWithHook('/rebind');
  const port = new URL(receiver.url).port;
  const answers: Record<string, string[][]> = { 'rebind.test': [['93.184.216.34'], ['127.0.0.1']] };
  const deliverer = (allowPrivate: boolean, lookup: (host: string) => Promise<string[]>) => new Deliverer({
    sql, box: svc.service.box, log: createLogger('silent'),
    targets: { allowPrivate, ownHosts: [], lookup },
    caFile: receiver.caFile, retry: { baseMs: 120_000, capMs: 120_000, maxAttempts: 15 },
    leaseMs: 30_000, concurrency: 4, perDestination: 4, pollMs: 100,
  });
  const row = (url: string) => ({
    id: '0', webhook_endpoint_id: hookId, job_id: 'job_r', pool_id: pool.id, event_type: 'async.job.completed',
    body: Buffer.from('{}'), body_sha256: '44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a', attempts: 1, url,
    signing_secret_enc: svc.service.box.seal('whsec_x'), auth_header: null, credential_enc: null,
  });
  // The check before the send sees a public address; the connection's own lookup then gets loopback.
  const rebinding = deliverer(false, async (host) => answers[host]!.shift() ?? ['127.0.0.1']);
  const refused = await rebinding.send(row(`https://rebind.test:${port}/rebind`));
  await rebinding.stop();
  t.match(refused, { ok: false, status: null, error: /connect time/ });
  t.equal(receiver.received.filter((r) => r.path === '/rebind').length, 0, 'nothing was sent');

  // The same lookup path connects normally when the answer is allowed.
  const allowed = deliverer(true, async () => ['127.0.0.1']);
  const ok = await allowed.send(row(`https://localhost:${port}/rebind`));
  await allowed.stop();
  t.match(ok, { ok: true, status: 200 });
});
