// Async jobs end to end through the real service: a pool with async on and an active destination turns
// requests into jobs (by header, when busy, after a timed-out wait), the runner forwards them to a real
// https origin, the result is polled on the lock API host with pool auth, and each terminal status sends
// its event to the destination (a real https receiver).
import { proxyHttpParser } from '../src/dataplane/http-parser.js';
import t from 'tap';
import { readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import { connect, type AddressInfo } from 'node:net';
import { dirname, join } from 'node:path';
import { Pool, request } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { JOB_BODY_CAP, RESULT_BODY_CAP, RETRY_BASE_MS, retryDelayMs } from '../src/jobs/job-limits.js';
import { soak } from './helpers/soak.js';
import { until } from './helpers/until.js';

/**
 * The runner's limits here: the result cap is the default 8 MiB in the soak run (test/soak/jobs.test.ts)
 * and 512 KiB in the default suite (above the 256 KiB inline limit, so the same paths run); the retry base
 * is 20 ms with no jitter (the default is 1 s, 4 s: see the backoff test).
 */
const RESULT_CAP = soak(RESULT_BODY_CAP, 512 * 1024);
const JOBS_TUNING = { resultBodyCap: RESULT_CAP, retryBaseMs: 20, random: () => 0.5 };
// Every wait below is an `until` on a state (20 s each); the file's limit only catches a hang. ~20 s on a quiet
// machine; at a load average of 15-19 the same run took over tap's default 120 s, 1 MiB bodies and 0.6 MiB
// results through the embedded store at 12-20 s a test, and was cut in its last test, which waits on nothing.
t.setTimeout(soak(1_800_000, 300_000));

let origin: Origin;
let svc: TestService;
let proxy: Pool;
let token: string;
let teamId: number;
let receiver: Server;
let receiverUrl: string;
/** Events received by the destination, by job id. */
const events = new Map<string, any[]>();

t.before(async () => {
  origin = await startOrigin();
  // The receiver reuses the origin's certificate, so one CA file is trusted by origins and webhooks.
  receiver = createServer({ key: readFileSync(join(dirname(origin.caFile), 'key.pem')), cert: readFileSync(origin.caFile) }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const ev = JSON.parse(Buffer.concat(chunks).toString());
      events.set(ev.id, [...(events.get(ev.id) ?? []), ev]);
      res.writeHead(200).end('ok');
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  receiverUrl = `https://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`;
  svc = await startTestService({ overrides: { originCaFile: origin.caFile, webhookCaFile: origin.caFile }, jobs: JOBS_TUNING });
  const boot = await svc.bootstrap({ plan: 'team' });
  token = boot.token;
  teamId = boot.team.id;
  proxy = new Pool(svc.proxyUrl!, { connections: 16 });
});
t.teardown(async () => {
  await proxy?.close();
  await svc?.close();
  await new Promise<void>((resolve) => receiver?.close(() => resolve()));
  await origin?.close();
});

const dp = () => svc.service.dataplane!;
const lockUrl = () => `http://127.0.0.1:${svc.service.ports.lock}`;

interface PoolOpts {
  origin?: string;
  maxConcurrent?: number;
  asyncOnQueue?: boolean;
  settings?: Record<string, unknown>;
  /** Attach an active destination (turns async on, as POST /api/v1/webhooks with pool_ids does). */
  destination?: boolean;
}

/** A pool (SQL: settings are not in the Control API) with a key; async turned on by attaching a destination. */
async function createPool(sub: string, o: PoolOpts = {}): Promise<{ id: number; key: string; webhookId: number | null }> {
  const sql = svc.service.sql;
  const url = o.origin ?? origin.url;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, settings, async_on_queue)
     VALUES ($1, $2, $3, 'http', $4, $5, $6, $7::jsonb, $8) RETURNING id`,
    [teamId, sub, sub, url, new URL(url).host, o.maxConcurrent ?? 10, JSON.stringify(o.settings ?? {}), o.asyncOnQueue ?? false],
  );
  const id = rows[0]!.id;
  await sql.notify(CHANGE_CHANNEL, `pool:${id}`);
  let webhookId: number | null = null;
  if (o.destination !== false) {
    const res = await svc.api('POST', '/api/v1/webhooks', { token, body: { name: `hook-${sub}`, url: receiverUrl, pool_ids: [id] } });
    if (res.status !== 201) throw new Error(`webhook create failed: ${res.status} ${JSON.stringify(res.body)}`);
    webhookId = res.body.data.id;
  }
  const k = await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token, body: {} });
  if (k.status !== 201) throw new Error(`mint failed: ${k.status}`);
  await dp().snapshots.reload();
  return { id, key: k.body.data.key, webhookId };
}

async function call(sub: string, path: string, o: { method?: string; headers?: Record<string, string>; body?: string | Buffer } = {}) {
  const res = await proxy.request({
    path,
    method: (o.method ?? 'GET') as 'GET',
    headers: { host: `${sub}.${svc.config.poolDomain}`, ...o.headers },
    body: o.body,
  });
  const text = await res.body.text();
  let json: any = null;
  try {
    json = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: res.statusCode, headers: res.headers, text, json };
}

async function poll(url: string, key: string | null) {
  const res = await request(url, { headers: key ? { 'x-service-key': key } : {} });
  const body = Buffer.from(await res.body.arrayBuffer());
  return { status: res.statusCode, headers: res.headers, body, json: (() => { try { return JSON.parse(body.toString()); } catch { return null; } })() };
}


/** Polls the job until it reaches a terminal status; returns the poll JSON. */
async function settled(pollUrl: string, key: string): Promise<any> {
  return until('a terminal job status', async () => {
    const p = await poll(pollUrl, key);
    return ['completed', 'failed', 'expired'].includes(p.json?.status) ? p.json : null;
  }, 20_000);
}

const eventOf = (jobId: string) => until(`the event of ${jobId}`, async () => events.get(jobId)?.[0]);

t.test('X-Service-Async: true runs the request as a job: 202, poll, raw result, one completed event', async (t) => {
  const p = await createPool('jobs-requested');
  origin.reset();
  const body = JSON.stringify({ hello: 'job' });
  const r = await call('jobs-requested', '/echo/path?q=1', {
    method: 'POST',
    headers: { 'x-service-key': p.key, 'x-service-async': 'true', 'content-type': 'application/json', 'x-custom': 'kept' },
    body,
  });
  t.equal(r.status, 202);
  t.match(r.json, { status: 'queued', reason: 'requested' });
  t.match(r.json.id, /^job_[A-Za-z0-9_-]{43}$/, 'an unguessable id');
  t.equal(r.json.poll_url, `${lockUrl()}/pools/jobs-requested/jobs/${r.json.id}`);
  t.equal(r.json.result_url, `${r.json.poll_url}/result`);
  t.equal(r.headers.location, r.json.poll_url);

  const job = await settled(r.json.poll_url, p.key);
  t.equal(job.status, 'completed');
  t.equal(job.reason, 'requested');
  t.equal(job.pool, `jobs-requested.${svc.config.poolDomain}`);
  t.equal(job.result.status, 200);
  t.equal(job.result.truncated, false);
  const echoed = JSON.parse(job.result.body);
  t.equal(echoed.method, 'POST');
  t.equal(echoed.url, '/echo/path?q=1');
  t.equal(echoed.bodyBytes, Buffer.byteLength(body), 'the stored body reached the origin');
  t.equal(echoed.headers['x-custom'], 'kept');
  t.equal(echoed.headers['x-service-key'], undefined, 'pool auth is not stored nor forwarded');
  t.equal(echoed.headers['x-service-async'], undefined);

  const raw = await poll(r.json.result_url, p.key);
  t.equal(raw.status, 200);
  t.equal(raw.headers['content-type'], 'application/json');
  t.equal(raw.headers['x-service-job-id'], r.json.id);
  t.same(JSON.parse(raw.body.toString()), echoed);

  const ev = await eventOf(r.json.id);
  t.equal(ev.type, 'async.job.completed');
  t.equal(ev.reason, 'requested');
  t.equal(ev.pool, `jobs-requested.${svc.config.poolDomain}`);
  t.equal(ev.detail.kind, 'http');
  t.equal(ev.detail.status, 200);
  t.equal(ev.detail.headers['content-type'], 'application/json');
  t.same(JSON.parse(ev.detail.body), echoed);
  t.notOk('truncated' in ev.detail);
  t.ok(ev.completedAt >= ev.createdAt);
  t.equal(events.get(r.json.id)!.length, 1, 'one event per terminal status');
});

t.test('a pool without an active destination serves synchronously; the header is ignored', async (t) => {
  const p = await createPool('jobs-nodest', { destination: false });
  await svc.service.sql.query('UPDATE pools SET async_enabled = true WHERE id = $1', [p.id]);
  await dp().snapshots.reload();
  let r = await call('jobs-nodest', '/x', { headers: { 'x-service-key': p.key, 'x-service-async': 'true' } });
  t.equal(r.status, 200, 'async on but no destination: synchronous');

  // A destination that is disabled does not count either.
  const q = await createPool('jobs-disabled');
  await svc.service.sql.query('UPDATE webhook_endpoints SET disabled = true WHERE id = $1', [q.webhookId]);
  await svc.service.sql.notify(CHANGE_CHANNEL, `webhook:${q.webhookId}`);
  await dp().snapshots.reload();
  r = await call('jobs-disabled', '/x', { headers: { 'x-service-key': q.key, 'x-service-async': 'true' } });
  t.equal(r.status, 200, 'only destination deactivated: synchronous');
  await svc.service.sql.query('UPDATE webhook_endpoints SET disabled = false WHERE id = $1', [q.webhookId]);
  await svc.service.sql.notify(CHANGE_CHANNEL, `webhook:${q.webhookId}`);
  await dp().snapshots.reload();
  r = await call('jobs-disabled', '/x', { headers: { 'x-service-key': q.key, 'x-service-async': 'true' } });
  t.equal(r.status, 202, 're-enabled: a job again');

  r = await call('jobs-disabled', '/x', { headers: { 'x-service-key': q.key } });
  t.equal(r.status, 200, 'without the header, a free slot serves synchronously');
});

t.test('busy: with async_on_queue and no free slot the request becomes a job at once', async (t) => {
  const p = await createPool('jobs-busy', { maxConcurrent: 1, asyncOnQueue: true });
  // The slot is held for 3 s: the 202 must come back while it still is (not after a wall-clock ceiling).
  let released = false;
  const holding = call('jobs-busy', '/delay/3000', { headers: { 'x-service-key': p.key } }).finally(() => (released = true));
  await until('the slot to be held', async () => dp().governor.state(p.id).inFlight === 1);
  const r = await call('jobs-busy', '/delay/1', { headers: { 'x-service-key': p.key } });
  t.equal(r.status, 202);
  t.equal(r.json.reason, 'busy');
  t.ok(!released && dp().governor.state(p.id).inFlight === 1, 'answered while the slot was still held: it did not wait for it');
  t.equal((await holding).status, 200);
  const job = await settled(r.json.poll_url, p.key);
  t.equal(job.status, 'completed');
  t.equal((await eventOf(r.json.id)).reason, 'busy');
});

t.test('wait_timeout: a sync wait that times out becomes a job', async (t) => {
  const p = await createPool('jobs-wait', { maxConcurrent: 1 });
  const holding = call('jobs-wait', '/delay/800', { headers: { 'x-service-key': p.key } });
  await until('the slot to be held', async () => dp().governor.state(p.id).inFlight === 1);
  const r = await call('jobs-wait', '/delay/1', { headers: { 'x-service-key': p.key, 'x-service-queue-timeout-ms': '100' } });
  t.equal(r.status, 202);
  t.equal(r.json.reason, 'wait_timeout');
  t.equal((await holding).status, 200);
  t.equal((await settled(r.json.poll_url, p.key)).status, 'completed');
});

t.test('request body cap: larger than the job cap is 413 and stores nothing', async (t) => {
  const p = await createPool('jobs-big');
  const before = await svc.service.sql.query<{ n: number }>('SELECT count(*)::int AS n FROM jobs WHERE pool_id = $1', [p.id]);
  const r = await call('jobs-big', '/x', { method: 'POST', headers: { 'x-service-key': p.key, 'x-service-async': 'true' }, body: Buffer.alloc(JOB_BODY_CAP + 1, 1) });
  t.equal(r.status, 413);
  t.equal(r.json.error, 'payload_too_large');
  const after = await svc.service.sql.query<{ n: number }>('SELECT count(*)::int AS n FROM jobs WHERE pool_id = $1', [p.id]);
  t.equal(after.rows[0]!.n, before.rows[0]!.n);
  const ok = await call('jobs-big', '/x', { method: 'POST', headers: { 'x-service-key': p.key, 'x-service-async': 'true' }, body: Buffer.alloc(JOB_BODY_CAP, 1) });
  t.equal(ok.status, 202, 'exactly the cap is accepted');
  const job = await settled(ok.json.poll_url, p.key);
  t.equal(JSON.parse(job.result.body).bodyBytes, JOB_BODY_CAP);
});

t.test('large and truncated results: resultUrl in the event, raw bytes on /result', async (t) => {
  const p = await createPool('jobs-large');
  const big = await call('jobs-large', '/download/300000', { headers: { 'x-service-key': p.key, 'x-service-async': 'true' } });
  const job = await settled(big.json.poll_url, p.key);
  t.equal(job.result.status, 200);
  t.notOk('body' in job.result, 'over 256 KiB: not inlined in the poll answer');
  t.equal(job.result.truncated, false);
  const ev = await eventOf(big.json.id);
  t.same(ev.detail, { kind: 'http', resultUrl: big.json.result_url }, 'size alone does not set truncated');
  const raw = await poll(big.json.result_url, p.key);
  t.equal(raw.body.length, 300000);
  const head = await request(big.json.result_url, { method: 'HEAD', headers: { 'x-service-key': p.key } });
  t.equal(head.statusCode, 200);
  t.equal(head.headers['content-length'], '300000', 'HEAD announces the stored length');
  await head.body.dump();

  const huge = await call('jobs-large', `/download/${RESULT_CAP + 100_000}?chunked=1`, { headers: { 'x-service-key': p.key, 'x-service-async': 'true' } });
  const hjob = await settled(huge.json.poll_url, p.key);
  t.equal(hjob.status, 'completed');
  t.equal(hjob.result.truncated, true);
  const hev = await eventOf(huge.json.id);
  t.same(hev.detail, { kind: 'http', resultUrl: huge.json.result_url, truncated: true });
  const hraw = await poll(huge.json.result_url, p.key);
  t.equal(hraw.body.length, RESULT_CAP);
  t.equal(hraw.headers['x-service-job-truncated'], 'true');
});

t.test('an upstream status is an answer: a 503 from the origin completes the job', async (t) => {
  const p = await createPool('jobs-503');
  const r = await call('jobs-503', '/status/503', { headers: { 'x-service-key': p.key, 'x-service-async': 'true' } });
  const job = await settled(r.json.poll_url, p.key);
  t.equal(job.status, 'completed');
  t.equal(job.result.status, 503);
  t.equal(job.attempts, 1);
  t.equal((await eventOf(r.json.id)).detail.status, 503);
});

t.test('retry backoff: the base, ×4 per attempt, ±25 % jitter from the given random source', async (t) => {
  t.equal(RETRY_BASE_MS, 1000, 'the service waits 1 s before the second attempt');
  t.same([1, 2, 3].map((n) => retryDelayMs(n, RETRY_BASE_MS, () => 0.5)), [1000, 4000, 16000]);
  t.same([0, 0.999999].map((r) => retryDelayMs(2, 20, () => r)), [60, 100], 'jitter spans 75 % to 125 % of 80 ms');
});

t.test('no answer after every attempt: failed, with one failed event and no detail', async (t) => {
  // A port nothing listens on: every attempt is refused.
  const dead = createServer();
  await new Promise<void>((resolve) => dead.listen(0, '127.0.0.1', resolve));
  const port = (dead.address() as AddressInfo).port;
  await new Promise<void>((resolve) => dead.close(() => resolve()));
  const p = await createPool('jobs-fail', { origin: `https://127.0.0.1:${port}` });
  const r = await call('jobs-fail', '/x', { headers: { 'x-service-key': p.key, 'x-service-async': 'true' } });
  const job = await settled(r.json.poll_url, p.key);
  t.equal(job.status, 'failed');
  t.equal(job.attempts, 3);
  t.equal(job.result, null);
  t.ok(job.error);
  const ev = await eventOf(r.json.id);
  t.equal(ev.type, 'async.job.failed');
  t.notOk('detail' in ev);
  const raw = await poll(r.json.result_url, p.key);
  t.equal(raw.status, 409);
  t.equal(raw.json.error, 'no_result');
});

t.test('not run before the pool TTL: expired, with one expired event', async (t) => {
  const p = await createPool('jobs-ttl', { maxConcurrent: 1, settings: { jobTtlMs: 1000, queueTimeoutMs: 5000 } });
  const holding = call('jobs-ttl', '/delay/2500', { headers: { 'x-service-key': p.key } });
  await until('the slot to be held', async () => dp().governor.state(p.id).inFlight === 1);
  const r = await call('jobs-ttl', '/x', { headers: { 'x-service-key': p.key, 'x-service-async': 'true' } });
  t.equal(r.status, 202);
  const queued = await poll(r.json.poll_url, p.key);
  t.equal(queued.json.status, 'queued');
  const notReady = await poll(r.json.result_url, p.key);
  t.equal(notReady.status, 409);
  t.equal(notReady.json.error, 'not_ready');
  const job = await settled(r.json.poll_url, p.key);
  t.equal(job.status, 'expired');
  t.equal(job.attempts, 0);
  const ev = await eventOf(r.json.id);
  t.equal(ev.type, 'async.job.expired');
  await holding;
});

t.test('polling needs the pool key of that pool; other ids are 404', async (t) => {
  const a = await createPool('jobs-auth-a');
  const b = await createPool('jobs-auth-b');
  const r = await call('jobs-auth-a', '/x', { headers: { 'x-service-key': a.key, 'x-service-async': 'true' } });
  await settled(r.json.poll_url, a.key);
  t.equal((await poll(r.json.poll_url, null)).status, 401);
  t.equal((await poll(r.json.poll_url, 'pgk_wrong')).status, 401);
  t.equal((await poll(r.json.poll_url, b.key)).status, 401, "another pool's key does not open this pool");
  const other = await poll(`${lockUrl()}/pools/jobs-auth-b/jobs/${r.json.id}`, b.key);
  t.equal(other.status, 404, "a job of another pool is not found through this pool");
  t.equal((await poll(`${lockUrl()}/pools/jobs-auth-a/jobs/job_nope`, a.key)).status, 404);
  t.equal((await poll(`${lockUrl()}/pools/no-such-pool/jobs/${r.json.id}`, a.key)).status, 404);
  const bearer = await request(r.json.poll_url, { headers: { authorization: `Bearer ${a.key}` } });
  t.equal(bearer.statusCode, 200, 'Bearer works as on the pool host');
  await bearer.body.dump();
  const post = await request(r.json.poll_url, { method: 'POST', headers: { 'x-service-key': a.key } });
  t.equal(post.statusCode, 405);
  await post.body.dump();
  const lockStill = await request(`${lockUrl()}/pools/jobs-auth-a/lock/acquire`, { method: 'POST', headers: { 'x-service-key': a.key } });
  t.equal(lockStill.statusCode, 200, 'the lock API on the same host is untouched');
  const grant = (await lockStill.body.json()) as { slotId: string };
  await (await request(`${lockUrl()}/pools/jobs-auth-a/lock/${grant.slotId}/release`, { method: 'POST' })).body.dump();
});

t.test('finished jobs are deleted after the retention period; the poll URL is then 404', async (t) => {
  const p = await createPool('jobs-retention');
  const r = await call('jobs-retention', '/x', { headers: { 'x-service-key': p.key, 'x-service-async': 'true' } });
  await settled(r.json.poll_url, p.key);
  // Age the job past the retention period (7 days), as if a week had gone by.
  await svc.service.sql.query(`UPDATE jobs SET completed_at = now() - interval '8 days' WHERE id = $1`, [r.json.id]);
  // The runner looks again when the retention ends (a week on, at most a minute late), and nothing announces an
  // UPDATE that moves the clock: the test asks for that look now.
  await svc.service.jobs!.sweep(false);
  await until('the job to be pruned', async () => (await poll(r.json.poll_url, p.key)).status === 404);
  const { rows } = await svc.service.sql.query('SELECT 1 FROM jobs WHERE id = $1', [r.json.id]);
  t.equal(rows.length, 0);
});

t.test('a client that leaves mid-body makes no job and holds nothing', async (t) => {
  const p = await createPool('jobs-abort');
  const port = Number(new URL(svc.proxyUrl!).port);
  const sock = connect(port, '127.0.0.1');
  await new Promise((r) => sock.once('connect', r));
  sock.write(
    `POST /x HTTP/1.1\r\nhost: jobs-abort.${svc.config.poolDomain}\r\nx-service-key: ${p.key}\r\nx-service-async: true\r\ncontent-length: 1000\r\n\r\n0123456789`,
  );
  await until('the request to be in flight', async () => dp().inFlight > 0);
  sock.destroy();
  await until('the request to be settled', async () => dp().inFlight === 0);
  const { rows } = await svc.service.sql.query('SELECT 1 FROM jobs WHERE pool_id = $1', [p.id]);
  t.equal(rows.length, 0, 'no job stored');
});

t.test("polling runs the pool's policies: an IP allowlist miss reads nothing", async (t) => {
  const p = await createPool('jobs-ip', { settings: { ipAllowlist: ['127.0.0.0/8'] } });
  const r = await call('jobs-ip', '/x', { headers: { 'x-service-key': p.key, 'x-service-async': 'true' } });
  t.equal(r.status, 202);
  t.equal((await settled(r.json.poll_url, p.key)).status, 'completed', 'allowed address: polled');
  await svc.service.sql.query(`UPDATE pools SET settings = $2::jsonb WHERE id = $1`, [p.id, JSON.stringify({ ipAllowlist: ['10.0.0.0/8'] })]);
  await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${p.id}`);
  await dp().snapshots.reload();
  const denied = await poll(r.json.poll_url, p.key);
  t.equal(denied.status, 403);
  t.equal(denied.json.error, 'unauthorized');
  t.equal((await poll(r.json.result_url, p.key)).status, 403);
});

t.test('a stored request the origin client refuses to send fails at once (no retries)', async (t) => {
  const p = await createPool('jobs-unsendable');
  const port = Number(new URL(svc.proxyUrl!).port);
  const sock = connect(port, '127.0.0.1');
  await new Promise((r) => sock.once('connect', r));
  // Raw non-ASCII bytes in the path: the listener takes them, undici will not send them upstream.
  sock.write(Buffer.concat([
    Buffer.from('GET /a'),
    Buffer.from([0xc3, 0x28, 0xff]),
    Buffer.from(` HTTP/1.1\r\nhost: jobs-unsendable.${svc.config.poolDomain}\r\nx-service-key: ${p.key}\r\nx-service-async: true\r\n\r\n`),
  ]));
  const head = await new Promise<string>((resolve) => {
    let d = '';
    sock.on('data', (c: Buffer) => {
      d += c.toString('latin1');
      if (d.includes('\r\n\r\n') && d.includes('}')) resolve(d);
    });
    sock.on('close', () => resolve(d));
  });
  sock.destroy();
  if (proxyHttpParser(svc.config) === 'node') {
    // llhttp refuses such a target at the door, so no job is made.
    t.match(head, /^HTTP\/1\.1 400 /);
    return;
  }
  t.match(head, /^HTTP\/1\.1 202 /);
  const body = JSON.parse(head.slice(head.indexOf('{')));
  const job = await settled(body.poll_url, p.key);
  t.equal(job.status, 'failed');
  t.equal(job.attempts, 1, 'not retried: it would fail the same way');
  t.match(job.error, /cannot be forwarded/);
});
