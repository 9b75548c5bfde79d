// Signed webhook deliveries to a real https receiver (spec: Events, Delivery headers, Canonical string, Body,
// Delivery semantics, Webhook destination state table): envelope and headers byte for byte, the signature
// recomputed here with node:crypto, retries with the identical body, deactivation at exactly 8 failures,
// reset on success, re-enable, rotation, outbound Authorization, and at-least-once across a worker crash.
import t from 'tap';
import { binArgv, spawnListening } from './helpers/process.js';
import type { ChildProcess } from 'node:child_process';
import { createHash, createHmac, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startTestService, type TestService } from './helpers/service.js';
import { startReceiver } from './helpers/receiver.js';
import { needServer } from './helpers/servers.js';
import { enqueueJobEvent } from '../src/webhooks/outbox.js';
import { retryDelayMs } from '../src/webhooks/backoff.js';
import { verifyDelivery } from '../src/index.js';
import { OFFLOAD_AT_BYTES } from '../src/webhooks/envelope-body.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import type { JobEvent } from '../src/jobs/job-event.js';
import { until } from './helpers/until.js';
import { DrivenGovernorTime } from './helpers/test-clock.js';

const receiver = await startReceiver();
t.teardown(() => receiver.close());
const svc = await startTestService({
  overrides: { webhookCaFile: receiver.caFile, webhookRetryBaseMs: 20, webhookRetryCapMs: 80 },
  // The send timeout on a clock the test never moves: the timeout's own test is webhook-receiver-faults, and a
  // loaded machine that takes 5 s over a loopback POST must not turn an expected success into a failure.
  webhookTime: new DrivenGovernorTime(),
});
t.teardown(() => svc.close());
const sql = svc.service.sql;
const boot = await svc.bootstrap({ plan: 'team' });

const hex = (n: number) => randomBytes(n).toString('hex');

async function newPool(s: TestService, teamId: number): Promise<{ id: number; host: string }> {
  const subdomain = `p-${hex(4)}`;
  const { rows } = await s.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, async_enabled)
     VALUES ($1, $2, $2, 'http', 'https://api.example.test', 'api.example.test', true) RETURNING id`,
    [teamId, subdomain],
  );
  return { id: rows[0]!.id, host: `${subdomain}.${s.config.poolDomain}` };
}

async function newHook(s: TestService, token: string, path: string, poolIds: number[], extra: Record<string, unknown> = {}) {
  const res = await s.api('POST', '/api/v1/webhooks', { token, body: { name: `h-${hex(3)}`, url: `${receiver.url}${path}`, pool_ids: poolIds, ...extra } });
  if (res.status !== 201) throw new Error(`create webhook: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body.data as { id: number; signing_secret: string };
}

function event(pool: { id: number; host: string }, over: Partial<JobEvent> = {}): JobEvent {
  return {
    jobId: `job_${hex(8)}`,
    poolId: pool.id,
    poolHost: pool.host,
    status: 'completed',
    reason: 'requested',
    createdAt: 1_763_800_000_000,
    completedAt: 1_763_800_001_234,
    detail: { kind: 'http', status: 201, headers: { 'content-type': 'application/json', 'x-trace': 'é ✓' }, body: '{"ok":true,"n":"\u0001"}' },
    ...over,
  };
}

const enqueue = (s: TestService, e: JobEvent) => s.service.sql.transaction((tx) => enqueueJobEvent(tx, e));

/** The signature as a receiver computes it from the spec, independently of the service's code. */
function expectedSignature(secret: string, ts: string, jobId: string, raw: Buffer): string {
  const bodyHash = createHash('sha256').update(raw).digest('hex');
  return createHmac('sha256', secret).update(`${ts}\n${jobId}\n${bodyHash}`).digest('hex');
}

async function endpointState(id: number) {
  const { rows } = await sql.query<{ disabled: boolean; consecutive_failures: number }>(
    'SELECT disabled, consecutive_failures FROM webhook_endpoints WHERE id = $1',
    [id],
  );
  return rows[0]!;
}


t.test('a terminal job event is POSTed once per active destination with the exact envelope and signed headers', async (t) => {
  const pool = await newPool(svc, boot.team.id);
  const hook = await newHook(svc, boot.token, '/exact', [pool.id]);
  const off = await newHook(svc, boot.token, '/never', [pool.id]);
  await sql.query('UPDATE webhook_endpoints SET disabled = true WHERE id = $1', [off.id]);
  const e = event(pool);
  t.equal(await enqueue(svc, e), 1, 'one outbox row: the disabled destination is omitted');
  t.equal(await enqueue(svc, e), 0, 'the same event enqueued twice is written once');
  const [got] = await receiver.waitFor('/exact', 1);
  const r = got!;
  t.equal(r.method, 'POST');
  const expectedBody =
    `{"apiVersion":"1","type":"async.job.completed","id":"${e.jobId}","pool":"${pool.host}","reason":"requested",` +
    `"createdAt":1763800000000,"completedAt":1763800001234,"detail":{"kind":"http","status":201,` +
    `"headers":{"content-type":"application/json","x-trace":"é ✓"},"body":"{\\"ok\\":true,\\"n\\":\\"\\u0001\\"}"}}`;
  t.equal(r.rawBody.toString('utf8'), expectedBody, 'body: spec fields in spec order, detail as the job gave it');
  t.equal(r.headers['content-type'], 'application/json');
  const h = r.headers;
  const ts = String(h['x-service-timestamp']);
  t.match(ts, /^\d+$/, 'timestamp in Unix seconds');
  t.ok(Math.abs(Number(ts) - Date.now() / 1000) < 10, 'timestamp is the send time');
  t.equal(h['x-service-job-id'], e.jobId);
  t.equal(h['x-service-webhook-id'], String(hook.id));
  t.equal(h['x-service-event'], 'async.job.completed');
  t.equal(h['x-service-signature'], expectedSignature(hook.signing_secret, ts, e.jobId, r.rawBody), 'HMAC-SHA256 over timestamp\\njob id\\nsha256(body)');
  for (const s of ['signature', 'timestamp', 'job-id', 'webhook-id', 'event']) {
    t.equal(h[`x-poolgate-${s}`], h[`x-service-${s}`], `older prefix x-poolgate-${s} carries the same value`);
  }
  t.equal(h.authorization, undefined, 'no Authorization without a credential');

  // The receiver helper accepts it, and refuses every kind of tampering.
  t.match(verifyDelivery(hook.signing_secret, h, r.rawBody, { toleranceSeconds: 300 }), { ok: true, jobId: e.jobId, event: 'async.job.completed' });
  t.same(verifyDelivery('whsec_wrong', h, r.rawBody), { ok: false, reason: 'signature_mismatch' });
  t.same(verifyDelivery(hook.signing_secret, h, Buffer.concat([r.rawBody, Buffer.from(' ')])), { ok: false, reason: 'signature_mismatch' });
  t.same(verifyDelivery(hook.signing_secret, h, r.rawBody, { toleranceSeconds: 300, now: Date.now() + 301_000 }), { ok: false, reason: 'stale_timestamp' });
  t.same(verifyDelivery(hook.signing_secret, { ...h, 'x-service-signature': undefined, 'x-poolgate-signature': undefined }, r.rawBody), { ok: false, reason: 'missing_signature' });
  const legacyOnly = Object.fromEntries(Object.entries(h).filter(([k]) => !k.startsWith('x-service-')));
  t.match(verifyDelivery(hook.signing_secret, legacyOnly, r.rawBody), { ok: true }, 'a receiver reading only the older prefix verifies too');

  const history = await until('history', async () => {
    const hist = await svc.admin(['webhook', 'history', '--team', boot.team.slug, '--id', String(hook.id)]);
    return hist.attempts.length === 1 && hist.attempts;
  });
  t.match(history[0], { job_id: e.jobId, pool_id: pool.id, pool: pool.host.split('.')[0], result: 'success', http_status: 200, error: null, attempt: 1 });
  t.type(history[0].latency_ms, 'number');
  const { rows } = await sql.query<{ status: string }>('SELECT status FROM webhook_deliveries WHERE job_id = $1', [e.jobId]);
  t.same(rows, [{ status: 'delivered' }], 'a delivered row leaves the pending outbox (kept for replay)');
  t.equal(receiver.received.filter((x) => x.path === '/never').length, 0);

  // An expired job with nothing to report: no detail key at all.
  const expired = event(pool, { status: 'expired', reason: 'wait_timeout', detail: undefined });
  await enqueue(svc, expired);
  const all = await receiver.waitFor('/exact', 2);
  t.same(JSON.parse(all[1]!.rawBody.toString()), {
    apiVersion: '1', type: 'async.job.expired', id: expired.jobId, pool: pool.host, reason: 'wait_timeout',
    createdAt: expired.createdAt, completedAt: expired.completedAt,
  });
  t.notOk(all[1]!.rawBody.toString().includes('detail'));
  t.equal(all[1]!.headers['x-service-event'], 'async.job.expired');
});

t.test('a large envelope (made in the worker pool) arrives byte for byte and verifies', async (t) => {
  const pool = await newPool(svc, boot.team.id);
  const hook = await newHook(svc, boot.token, '/large', [pool.id]);
  const body = 'é"\n'.repeat(OFFLOAD_AT_BYTES / 2);
  t.ok(body.length >= OFFLOAD_AT_BYTES, 'above the offload threshold');
  const e = event(pool, { detail: { kind: 'http', status: 200, headers: {}, body } });
  await enqueue(svc, e);
  const [r] = await receiver.waitFor('/large', 1);
  t.ok(r!.rawBody.equals(Buffer.from(JSON.stringify({
    apiVersion: '1', type: 'async.job.completed', id: e.jobId, pool: pool.host, reason: 'requested',
    createdAt: e.createdAt, completedAt: e.completedAt, detail: e.detail,
  }))), 'the exact serialised envelope');
  t.equal(r!.headers['x-service-signature'], expectedSignature(hook.signing_secret, String(r!.headers['x-service-timestamp']), e.jobId, r!.rawBody));
});

t.test('failures are retried with the identical body; a success resets the failure streak', async (t) => {
  const pool = await newPool(svc, boot.team.id);
  const hook = await newHook(svc, boot.token, '/flaky', [pool.id]);
  receiver.queue('/flaky', { status: 500 }, 'reset', { status: 429 });
  const e = event(pool, { status: 'failed' });
  await enqueue(svc, e);
  const got = await receiver.waitFor('/flaky', 4);
  const bodies = new Set(got.map((g) => g.rawBody.toString('base64')));
  t.equal(bodies.size, 1, 'every attempt sends the same bytes');
  for (const g of got) {
    t.equal(g.headers['x-service-signature'], expectedSignature(hook.signing_secret, String(g.headers['x-service-timestamp']), e.jobId, g.rawBody));
  }
  const hist = await until('4 attempts', async () => {
    const h = await svc.admin(['webhook', 'history', '--team', boot.team.slug, '--id', String(hook.id)]);
    return h.attempts.length === 4 && h.attempts;
  });
  const oldestFirst = [...hist].reverse();
  t.same(oldestFirst.map((a: any) => [a.attempt, a.result, a.http_status]), [[1, 'failure', 500], [2, 'failure', null], [3, 'failure', 429], [4, 'success', 200]]);
  t.match(oldestFirst[1].error, /./, 'a reset is recorded with its error');
  t.same(await endpointState(hook.id), { disabled: false, consecutive_failures: 0 });
});

t.test('8 consecutive failures deactivate the destination at exactly 8; kept deliveries resume on Re-enable', async (t) => {
  const pool = await newPool(svc, boot.team.id);
  const hook = await newHook(svc, boot.token, '/down', [pool.id]);
  const feed: string[] = [];
  const unlisten = await sql.listen(CHANGE_CHANNEL, (p) => feed.push(p));
  t.teardown(unlisten);
  receiver.on('/down', { status: 503 });
  const e = event(pool);
  await enqueue(svc, e);
  await until('deactivation', async () => (await endpointState(hook.id)).disabled);
  const atDeactivation = receiver.received.filter((r) => r.path === '/down').length;
  t.equal(atDeactivation, 8, 'deactivated by the 8th failed attempt, not before');
  t.same(await endpointState(hook.id), { disabled: true, consecutive_failures: 8 });
  t.ok(feed.includes(`webhook:${hook.id}`), 'the change feed is told (the data plane falls back to sync)');
  t.equal(await enqueue(svc, event(pool)), 0, 'new events skip a deactivated destination');
  // The positive signal that the kept row would have been claimed (issue 28): once it is due, a delivery to
  // another destination is claimed and sent. A claim takes the oldest due rows first and counts the attempt
  // in the same statement, so a claim that reached the later row would have taken the kept one.
  await until('the kept delivery due', async () =>
    (await sql.query<{ due: boolean }>('SELECT next_attempt_at <= now() AS due FROM webhook_deliveries WHERE job_id = $1', [e.jobId])).rows[0]?.due);
  await newHook(svc, boot.token, '/down-witness', [pool.id]);
  await enqueue(svc, event(pool));
  await receiver.waitFor('/down-witness', 1);
  const kept = await sql.query<{ status: string; attempts: number }>('SELECT status, attempts FROM webhook_deliveries WHERE job_id = $1', [e.jobId]);
  t.same(kept.rows, [{ status: 'pending', attempts: 8 }], 'the pending delivery is kept, unclaimed, while deactivated');
  t.equal(receiver.received.filter((r) => r.path === '/down').length, 8, 'no attempt to a deactivated destination');

  receiver.on('/down', 'ok');
  await svc.admin(['webhook', 'enable', '--team', boot.team.slug, '--id', String(hook.id)]);
  const got = await receiver.waitFor('/down', 9);
  t.equal(got[8]!.headers['x-service-job-id'], e.jobId, 'the kept delivery is sent after Re-enable');
  const hist = await until('the success recorded', async () => {
    const h = await svc.admin(['webhook', 'history', '--team', boot.team.slug, '--id', String(hook.id), '--limit', '20']);
    return h.attempts.length === 9 && h;
  });
  t.same(hist.attempts.map((a: any) => [a.attempt, a.result]), [[9, 'success'], ...[8, 7, 6, 5, 4, 3, 2, 1].map((n) => [n, 'failure'])]);
  t.same(await endpointState(hook.id), { disabled: false, consecutive_failures: 0 });
});

t.test('after rotate the next delivery is signed with the new secret', async (t) => {
  const pool = await newPool(svc, boot.team.id);
  const hook = await newHook(svc, boot.token, '/rotated', [pool.id]);
  const rotated = await svc.api('POST', `/api/v1/webhooks/${hook.id}/rotate`, { token: boot.token });
  t.equal(rotated.status, 200);
  const fresh = rotated.body.data.signing_secret as string;
  t.not(fresh, hook.signing_secret);
  await enqueue(svc, event(pool));
  const [r] = await receiver.waitFor('/rotated', 1);
  t.match(verifyDelivery(fresh, r!.headers, r!.rawBody), { ok: true });
  t.same(verifyDelivery(hook.signing_secret, r!.headers, r!.rawBody), { ok: false, reason: 'signature_mismatch' });
});

t.test('a bearer_static credential is sent as Authorization: Bearer, or raw in the header named by auth_header', async (t) => {
  const pool = await newPool(svc, boot.team.id);
  const token = `tok-${hex(8)}`;
  const credName = `cred-${hex(3)}`;
  await newHook(svc, boot.token, '/auth', [pool.id], { new_credential: { name: credName, bearer_token: token } });
  const { rows } = await sql.query<{ id: number }>('SELECT id FROM credentials WHERE team_id = $1 AND name = $2', [boot.team.id, credName]);
  await newHook(svc, boot.token, '/auth-header', [pool.id], { credential_id: rows[0]!.id, auth_header: 'x-hook-token' });
  await enqueue(svc, event(pool));
  const [a] = await receiver.waitFor('/auth', 1);
  const [b] = await receiver.waitFor('/auth-header', 1);
  t.equal(a!.headers.authorization, `Bearer ${token}`);
  t.equal(b!.headers['x-hook-token'], token);
  t.equal(b!.headers.authorization, undefined);
});

t.test('at-least-once: a worker killed mid-delivery leaves the row, and the next worker sends it again', async (t) => {
  const skip = await needServer('postgres');
  if (skip) return void t.skip(skip);
  const secretKey = randomBytes(32).toString('hex');
  const pgSvc = await startTestService({ engine: 'postgres', roles: ['control'], overrides: { secretKey } });
  t.teardown(() => pgSvc.close());
  const team = await pgSvc.bootstrap({ plan: 'team' });
  const pool = await newPool(pgSvc, team.team.id);
  const hook = await newHook(pgSvc, team.token, '/crash', [pool.id]);
  const dataDir = mkdtempSync(join(tmpdir(), 'poolgate-worker-'));
  t.teardown(() => rmSync(dataDir, { recursive: true, force: true }));
  const workers: ChildProcess[] = [];
  t.teardown(() => workers.forEach((w) => w.exitCode === null && w.kill('SIGKILL')));
  // The worker's listening line (its deliverer has started) is the positive signal, and a worker that fails to
  // start exits (spawnListening rejects at once): the limit only catches a hung start, wide enough for a start
  // at a load of ~25 (docs/testing.md). The deliveries are then waited for apart from the start.
  const startWorker = async () => {
    const { child } = await spawnListening(binArgv('worker'), {
      cwd: process.cwd(),
      name: 'poolgate worker',
      timeoutMs: 90_000,
      env: {
        ...process.env,
        DATABASE_URL: pgSvc.config.databaseUrl!,
        POOLGATE_SECRET_KEY: secretKey,
        POOLGATE_DATA_DIR: dataDir,
        POOLGATE_ALLOW_PRIVATE_TARGETS: 'true',
        POOLGATE_WEBHOOK_CA_FILE: receiver.caFile,
        POOLGATE_WEBHOOK_CLAIM_LEASE_MS: '6000',
        // Not the default metrics port: another test's process may hold it (the worker then exits at start).
        POOLGATE_METRICS_PORT: '0',
        POOLGATE_LOG_LEVEL: 'silent',
      },
    });
    workers.push(child);
    return child;
  };
  receiver.queue('/crash', 'hang');
  const first = await startWorker();
  const e = event(pool);
  await enqueue(pgSvc, e);
  await receiver.waitFor('/crash', 1);
  first.kill('SIGKILL'); // a crash: nothing recorded, the claim lease still runs
  await new Promise((r) => first.once('exit', r));
  await startWorker();
  // The claim lease (6 s on the store's clock) lapses, and the new worker's poll (1 s) claims the row again.
  const got = await receiver.waitFor('/crash', 2);
  t.equal(got[1]!.headers['x-service-job-id'], e.jobId, 'the same job is delivered again');
  t.ok(got[1]!.rawBody.equals(got[0]!.rawBody), 'with the same body');
  const hist = await until('the success', async () => {
    const { rows } = await pgSvc.service.sql.query<{ result: string; attempt: number }>(
      'SELECT result, attempt FROM webhook_delivery_attempts WHERE webhook_endpoint_id = $1',
      [hook.id],
    );
    return rows.length > 0 && rows;
  });
  t.same(hist, [{ result: 'success', attempt: 2 }], 'the crashed attempt counts; the redelivery is attempt 2');
});

t.test('retry schedule: full jitter under a doubling ceiling, capped', async (t) => {
  const s = { baseMs: 10_000, capMs: 3_600_000, maxAttempts: 15 };
  const top = () => 0.999_999_9;
  const ceilings = Array.from({ length: 14 }, (_, i) => retryDelayMs(s, i + 1, top) + 1);
  t.same(ceilings, [10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600, 3600, 3600, 3600, 3600].map((x) => x * 1000));
  t.equal(retryDelayMs(s, 3, () => 0), 0, 'the wait may be anything from 0');
  const draws = Array.from({ length: 200 }, () => retryDelayMs(s, 4));
  t.ok(draws.every((d) => d >= 0 && d < 80_000) && new Set(draws).size > 150, 'uniform over [0, ceiling)');
});

t.test('verifyDelivery refuses malformed input with a reason and reads fetch Headers', async (t) => {
  const secret = 'whsec_test';
  const raw = Buffer.from('{"apiVersion":"1"}');
  const ts = String(Math.floor(Date.now() / 1000));
  const sig = expectedSignature(secret, ts, 'job_1', raw);
  const good = { 'x-service-signature': sig, 'x-service-timestamp': ts, 'x-service-job-id': 'job_1' };
  t.match(verifyDelivery(secret, new Headers(good), raw), { ok: true, jobId: 'job_1', timestamp: Number(ts) });
  t.match(verifyDelivery(secret, { 'X-Service-Signature': sig, 'X-Service-Timestamp': ts, 'X-Service-Job-Id': 'job_1' }, raw.toString()), { ok: true }, 'any header case, string body');
  t.same(verifyDelivery(secret, { ...good, 'x-service-timestamp': '17e8' }, raw), { ok: false, reason: 'malformed_timestamp' });
  t.same(verifyDelivery(secret, { ...good, 'x-service-timestamp': undefined }, raw), { ok: false, reason: 'missing_timestamp' });
  t.same(verifyDelivery(secret, { ...good, 'x-service-job-id': undefined }, raw), { ok: false, reason: 'missing_job_id' });
  t.same(verifyDelivery(secret, { ...good, 'x-service-job-id': 'job_2' }, raw), { ok: false, reason: 'signature_mismatch' }, 'the job id is signed');
  t.same(verifyDelivery(secret, { ...good, 'x-service-signature': 'zz' }, raw), { ok: false, reason: 'signature_mismatch' });
  t.same(verifyDelivery(secret, good, raw, { toleranceSeconds: 60, now: Date.now() - 120_000 }), { ok: false, reason: 'stale_timestamp' }, 'a timestamp from the future is refused too');
});
