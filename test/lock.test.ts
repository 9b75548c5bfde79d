// The lock API through its real uWS listener with undici as the client: routing, pool auth, acquire
// (grant, fail fast, waits, bodies), renew (extension, the request-deadline cap, reclaim), release with
// outcome reports, the access log, and one shared limit with proxy traffic to a real https origin.
import t, { type Test } from 'tap';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { Pool } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { sleep, until } from './helpers/until.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { MemoryGovernor } from '../src/governor/memory.js';
import type { AdmitRequest, Governor, Outcome } from '../src/governor/governor.js';
import { LockServer } from '../src/lock/server.js';
import { createLogger } from '../src/log.js';

const logDir = mkdtempSync(join(tmpdir(), 'poolgate-lock-'));
const accessLogFile = join(logDir, 'access.log');
let origin: Origin;
let svc: TestService;
let lock: Pool;
let proxy: Pool;
let token: string;
let teamId: number;

t.before(async () => {
  origin = await startOrigin();
  svc = await startTestService({ overrides: { originCaFile: origin.caFile, accessLogFile } });
  const boot = await svc.bootstrap();
  token = boot.token;
  teamId = boot.team.id;
  lock = new Pool(svc.lockUrl!, { connections: 32 });
  proxy = new Pool(svc.proxyUrl!, { connections: 16 });
});
t.teardown(async () => {
  await lock?.close();
  await proxy?.close();
  await svc?.close();
  await origin?.close();
  rmSync(logDir, { recursive: true, force: true });
});

const dp = () => svc.service.dataplane!;

/** A pool made with SQL (lease and queue settings are not in the Control API), announced on the change feed. */
async function createPool(sub: string, o: { maxConcurrent?: number; requireKey?: boolean; settings?: Record<string, unknown> } = {}): Promise<number> {
  const sql = svc.service.sql;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, $2, $3, 'http', $4, $5, $6, $7, $8::jsonb) RETURNING id`,
    [teamId, sub, sub, origin.url, new URL(origin.url).host, o.maxConcurrent ?? 10, o.requireKey ?? true, JSON.stringify(o.settings ?? {})],
  );
  await sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await dp().snapshots.reload();
  return rows[0]!.id;
}

async function mintKey(sub: string): Promise<string> {
  const res = await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token, body: {} });
  if (res.status !== 201) throw new Error(`mint failed: ${res.status} ${JSON.stringify(res.body)}`);
  await dp().snapshots.reload();
  return res.body.data.key;
}

interface Res {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  json: any;
  ms: number;
}

async function post(path: string, o: { key?: string | null; body?: unknown; raw?: string | Buffer; headers?: Record<string, string>; method?: string; on?: Pool } = {}): Promise<Res> {
  const headers: Record<string, string> = { ...o.headers };
  if (o.key) headers['x-service-key'] = o.key;
  let body = o.raw;
  if (o.body !== undefined) {
    body = JSON.stringify(o.body);
    headers['content-type'] = 'application/json';
  }
  const started = performance.now();
  const res = await (o.on ?? lock).request({ path, method: (o.method ?? 'POST') as 'POST', headers, body });
  const text = await res.body.text();
  let json: any;
  try {
    json = JSON.parse(text);
  } catch {
    json = text;
  }
  return { status: res.statusCode, headers: res.headers, json, ms: performance.now() - started };
}

const acquire = (pool: string, key: string | null, o: { body?: unknown; raw?: string; headers?: Record<string, string> } = {}) =>
  post(`/pools/${pool}/lock/acquire`, { key, ...o });
const renew = (pool: string, key: string | null, slotId: string) => post(`/pools/${pool}/lock/${slotId}/renew`, { key });
const release = (pool: string, key: string | null, slotId: string, body?: unknown) => post(`/pools/${pool}/lock/${slotId}/release`, { key, body });

t.test('only POST on /pools/{pool}/lock/…; unknown paths and pools are 404 not_found', async (t) => {
  await createPool('lk-route');
  const key = await mintKey('lk-route');
  for (const method of ['GET', 'PUT', 'DELETE']) {
    const r = await post('/pools/lk-route/lock/acquire', { key, method });
    t.equal(r.status, 405, method);
    t.equal(r.json.error, 'method_not_allowed');
    t.equal(r.headers.allow, 'POST');
  }
  for (const path of ['/', '/pools/lk-route/lock', '/pools/lk-route/acquire', '/pools/lk-route/lock/acquire/x', '/api/v1/me', '/pools/lk-route/lock/abc/extend']) {
    const r = await post(path, { key });
    t.equal(r.status, 404, path);
    t.equal(r.json.error, 'not_found');
  }
  const r = await acquire('no-such-pool', key);
  t.equal(r.status, 404);
  t.same(r.json.error, 'not_found');
  t.equal(dp().governor.state(svc.service.dataplane!.snapshots.current.pools.get('lk-route')!.id).inFlight, 0, 'nothing was taken');
});

t.test('the path names the pool (any case, one trailing slash); suspended pools are 503; database pools and read keys lease too', async (t) => {
  const id = await createPool('lk-path');
  const key = await mintKey('lk-path');
  const upper = await acquire('LK-Path', key);
  t.equal(upper.status, 200, 'the label is matched without case');
  const slash = await post(`/pools/lk-path/lock/${upper.json.slotId}/release/`, { key });
  t.same(slash.json, { released: true }, 'one trailing slash is tolerated');

  const res = await svc.api('POST', '/api/v1/pools/lk-path/keys', { token, body: { access: 'read' } });
  await dp().snapshots.reload();
  const readGrant = await acquire('lk-path', res.body.data.key);
  t.equal(readGrant.status, 200, 'a read key leases slots: the lock API forwards nothing');
  await release('lk-path', key, readGrant.json.slotId);

  await svc.service.sql.query(`UPDATE pools SET status = 'suspended' WHERE id = $1`, [id]);
  await dp().snapshots.reload();
  const suspended = await acquire('lk-path', key);
  t.equal(suspended.status, 503);
  t.equal(suspended.json.error, 'unavailable');
  await svc.service.sql.query(`UPDATE pools SET status = 'deleted' WHERE id = $1`, [id]);
  await dp().snapshots.reload();
  t.equal((await acquire('lk-path', key)).status, 404, 'a deleted pool is not found');

  const { rows } = await svc.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, db_host, db_name, max_concurrent, require_key)
     VALUES ($1, 'lk-db', 'lk-db', 'postgres', 'db.example.com', 'app', 1, true) RETURNING id`,
    [teamId],
  );
  await dp().snapshots.reload();
  const dbKey = await mintKey('lk-db');
  const dbGrant = await acquire('lk-db', dbKey);
  t.equal(dbGrant.status, 200, 'a database pool leases its slots');
  t.equal(dp().governor.state(rows[0]!.id).inFlight, 1, 'the same governor slots its SQL traffic uses');
  t.equal((await acquire('lk-db', dbKey)).status, 429);
  t.same((await release('lk-db', dbKey, dbGrant.json.slotId)).json, { released: true });
});

t.test('pool auth: X-Service-Key or Bearer; missing, wrong and other pools\' keys are 401 unauthorized', async (t) => {
  const id = await createPool('lk-auth', { maxConcurrent: 5 });
  await createPool('lk-auth-other');
  const key = await mintKey('lk-auth');
  const otherKey = await mintKey('lk-auth-other');
  for (const headers of [{}, { 'x-service-key': 'pgk_wrong' }, { 'x-service-key': otherKey }, { authorization: 'Bearer pgk_wrong' }] as Array<Record<string, string>>) {
    const r = await acquire('lk-auth', null, { headers });
    t.equal(r.status, 401, JSON.stringify(headers));
    t.equal(r.json.error, 'unauthorized');
  }
  t.equal(dp().governor.state(id).inFlight, 0, 'refused callers took no slot');
  const viaHeader = await acquire('lk-auth', key);
  t.equal(viaHeader.status, 200);
  const viaBearer = await acquire('lk-auth', null, { headers: { authorization: `Bearer ${key}` } });
  t.equal(viaBearer.status, 200);
  t.equal(dp().governor.state(id).inFlight, 2);
  // Renew and release need pool auth too.
  t.equal((await renew('lk-auth', null, viaHeader.json.slotId)).status, 401);
  t.equal((await release('lk-auth', 'pgk_wrong', viaHeader.json.slotId)).status, 401);
  t.equal(dp().governor.state(id).inFlight, 2, 'an unauthenticated release freed nothing');
  t.same((await release('lk-auth', key, viaHeader.json.slotId)).json, { released: true });
  t.same((await release('lk-auth', key, viaBearer.json.slotId)).json, { released: true });
  // A pool that does not require a key admits anonymous lock callers.
  await createPool('lk-open', { requireKey: false });
  const anon = await acquire('lk-open', null);
  t.equal(anon.status, 200);
  t.same((await release('lk-open', null, anon.json.slotId)).json, { released: true });
});

t.test('acquire grants a slot: slotId, deadlines from the pool settings, governor headers', async (t) => {
  const id = await createPool('lk-grant', { maxConcurrent: 3, settings: { leaseTermMs: 30_000, renewIntervalMs: 10_000, requestTimeoutMs: 120_000 } });
  const key = await mintKey('lk-grant');
  const before = Date.now();
  const a = await acquire('lk-grant', key);
  const after = Date.now();
  t.equal(a.status, 200);
  t.match(a.headers['content-type'], /application\/json/);
  const g = a.json;
  t.same(Object.keys(g).sort(), ['leaseDeadline', 'renewIntervalMs', 'requestDeadline', 'slotId', 'termMs']);
  t.match(g.slotId, /^[A-Za-z0-9_-]{22,}$/, 'an unguessable slot id (128 random bits)');
  t.equal(g.termMs, 30_000);
  t.equal(g.renewIntervalMs, 10_000);
  t.ok(g.leaseDeadline >= before + 30_000 && g.leaseDeadline <= after + 30_000, 'leaseDeadline = now + termMs (Unix ms)');
  t.ok(g.requestDeadline >= before + 120_000 && g.requestDeadline <= after + 120_000, 'requestDeadline = now + requestTimeoutMs');
  t.equal(a.headers['x-service-remaining-slots'], '2');
  t.equal(a.headers['x-service-effective-limit'], '3');
  t.equal(a.headers['x-service-queued-ms'], '0');
  const b = await acquire('lk-grant', key);
  t.not(b.json.slotId, g.slotId, 'each grant has its own slot id');
  t.equal(dp().governor.state(id).inFlight, 2);
  await release('lk-grant', key, g.slotId);
  await release('lk-grant', key, b.json.slotId);
  t.equal(dp().governor.state(id).inFlight, 0);
});

t.test('no free slot: 429 fail fast with Retry-After; waits from waitMs or the header, body wins, No-Queue forces fail fast, clamped to the queue timeout', async (t) => {
  const id = await createPool('lk-wait', { maxConcurrent: 1, settings: { queueTimeoutMs: 400 } });
  const key = await mintKey('lk-wait');
  const held = await acquire('lk-wait', key);
  t.equal(held.status, 200);

  const fast = await acquire('lk-wait', key);
  t.equal(fast.status, 429, 'no waitMs: fail fast');
  t.equal(fast.json.error, 'too_many_requests');
  t.match(fast.headers['retry-after'], /^\d+$/);
  t.equal(fast.headers['x-service-remaining-slots'], '0');
  t.ok(fast.ms < 300);

  const waited = await acquire('lk-wait', key, { body: { waitMs: 150 } });
  t.equal(waited.status, 504);
  t.equal(waited.json.error, 'queue_timeout');
  t.ok(waited.ms >= 140, `waited ${waited.ms} ms`);

  const byHeader = await acquire('lk-wait', key, { headers: { 'x-service-queue-timeout-ms': '150' } });
  t.equal(byHeader.status, 504, 'the header sets the wait');
  t.ok(byHeader.ms >= 140);

  const bodyWins = await acquire('lk-wait', key, { body: { waitMs: 0 }, headers: { 'x-service-queue-timeout-ms': '5000' } });
  t.equal(bodyWins.status, 429, 'body waitMs 0 wins over the header');
  t.ok(bodyWins.ms < 300);

  const noQueue = await acquire('lk-wait', key, { body: { waitMs: 5000 }, headers: { 'x-service-no-queue': '1' } });
  t.equal(noQueue.status, 429, 'X-Service-No-Queue forces fail fast');
  t.ok(noQueue.ms < 300);

  const clamped = await acquire('lk-wait', key, { body: { waitMs: 60_000 } });
  t.equal(clamped.status, 504, 'waitMs is clamped to the pool queue timeout (400 ms)');
  t.ok(clamped.ms >= 390 && clamped.ms < 3000, `waited ${clamped.ms} ms`);

  // A waiter gets the slot the moment it is released.
  const pending = acquire('lk-wait', key, { body: { waitMs: 2000 } });
  // Queued from here on (the request reaches the queue a moment after it is sent): 120 ms more before the release.
  await until('the waiter to be queued', () => dp().governor.state(id).queued === 1);
  await sleep(120);
  t.same((await release('lk-wait', key, held.json.slotId)).json, { released: true });
  const got = await pending;
  t.equal(got.status, 200);
  t.ok(Number(got.headers['x-service-queued-ms']) >= 100, `queued ${got.headers['x-service-queued-ms']} ms`);
  await release('lk-wait', key, got.json.slotId);
  t.equal(dp().governor.state(id).inFlight, 0);
});

t.test('acquire bodies: malformed or invalid → 400, over 4 KiB → 413; nothing is taken', async (t) => {
  const id = await createPool('lk-body');
  const key = await mintKey('lk-body');
  for (const raw of ['{', '[1]', '"x"', '{"waitMs":-1}', '{"waitMs":1.5}', '{"waitMs":"10"}', '{"waitMs":null}', '{"waitMS":10}']) {
    const r = await acquire('lk-body', key, { raw, headers: { 'content-type': 'application/json' } });
    t.equal(r.status, 400, raw);
    t.equal(r.json.error, 'bad_request');
    t.type(r.json.message, 'string');
  }
  const badHeader = await acquire('lk-body', key, { headers: { 'x-service-queue-timeout-ms': 'soon' } });
  t.equal(badHeader.status, 400);
  const big = await acquire('lk-body', key, { raw: JSON.stringify({ waitMs: 1, pad: 'x'.repeat(5000) }) });
  t.equal(big.status, 413);
  t.equal(big.json.error, 'payload_too_large');
  // Without a declared length the body is counted as it streams in.
  const chunked = await lock.request({
    path: '/pools/lk-body/lock/acquire',
    method: 'POST',
    headers: { 'x-service-key': key },
    body: Readable.from([Buffer.alloc(3000, 0x20), Buffer.alloc(3000, 0x20)]),
  });
  t.equal(chunked.statusCode, 413, 'a chunked body over 4 KiB');
  t.equal(((await chunked.body.json()) as any).error, 'payload_too_large');
  t.equal(dp().governor.state(id).inFlight, 0);
  const empty = await acquire('lk-body', key, { raw: '' });
  t.equal(empty.status, 200, 'an empty body is an acquire without wait');
  await release('lk-body', key, empty.json.slotId);
});

/**
 * A lock listener over the service's snapshot with a governor of its own and a clock the test moves: the
 * lease registry takes its time from `clock`, so a test about lease terms jumps time instead of sleeping
 * around them (issue 28 §1). The janitor's timer still runs on real time, but it only reclaims what the
 * clock says is overdue, so a lease is held or reclaimed by the clock alone.
 */
async function lockOnClock(t: Test, pools: number[]): Promise<{ on: Pool; governor: MemoryGovernor; advance: (ms: number) => number; now: () => number }> {
  let now = Date.now();
  const governor = new MemoryGovernor();
  const snapshots = dp().snapshots;
  governor.configure([...snapshots.current.pools.values()].filter((p) => pools.includes(p.id)).map((p) => ({ poolId: p.id, maxConcurrent: p.maxConcurrent, queueLength: 10, queueTimeoutMs: 1000, budgetId: null, reservedConcurrent: 0 })), []);
  const server = await LockServer.start({ host: '127.0.0.1', port: 0, governor, snapshots, log: createLogger('silent'), accessLog: null, clock: () => now });
  const on = new Pool(`http://127.0.0.1:${server.port}`);
  t.teardown(async () => {
    await on.close();
    await server.close();
  });
  return { on, governor, advance: (ms) => (now += ms), now: () => now };
}

t.test('renew extends the lease by a term, never past requestDeadline; then 409 capped; gone slots are 404', async (t) => {
  const id = await createPool('lk-renew', { settings: { leaseTermMs: 1000, renewIntervalMs: 300, requestTimeoutMs: 1500 } });
  const otherId = await createPool('lk-renew-other');
  const key = await mintKey('lk-renew');
  const otherKey = await mintKey('lk-renew-other');
  const c = await lockOnClock(t, [id, otherId]);
  const at = (path: string, k: string, o: { raw?: string } = {}) => post(path, { key: k, on: c.on, ...o });
  const granted = c.now();
  const g = (await at('/pools/lk-renew/lock/acquire', key)).json;
  t.equal(g.leaseDeadline, granted + 1000, 'the first term from the grant');
  t.equal(g.requestDeadline, granted + 1500, 'the cap is requestTimeoutMs from the grant');
  c.advance(100);
  const r1 = await at(`/pools/lk-renew/lock/${g.slotId}/renew`, key);
  t.equal(r1.status, 200);
  t.same(Object.keys(r1.json), ['leaseDeadline']);
  t.equal(r1.json.leaseDeadline, c.now() + 1000, 'extended by one term from now');
  const withBody = await at(`/pools/lk-renew/lock/${g.slotId}/renew`, key, { raw: 'ignored' });
  t.equal(withBody.status, 200, 'a renew body is read and ignored');
  t.equal((await at(`/pools/lk-renew-other/lock/${g.slotId}/renew`, otherKey)).status, 404, 'a slotId of another pool is not found');
  t.same((await at(`/pools/lk-renew-other/lock/${g.slotId}/release`, otherKey)).json, { released: false }, 'nor released through another pool');
  c.advance(500);
  const r2 = await at(`/pools/lk-renew/lock/${g.slotId}/renew`, key);
  t.equal(r2.status, 200);
  t.equal(r2.json.leaseDeadline, g.requestDeadline, 'the extension stops at requestDeadline');
  const capped = await at(`/pools/lk-renew/lock/${g.slotId}/renew`, key);
  t.equal(capped.status, 409);
  t.equal(capped.json.error, 'capped');
  t.equal(c.governor.state(id).inFlight, 1, 'a capped slot is still held until released');
  t.same((await at(`/pools/lk-renew/lock/${g.slotId}/release`, key)).json, { released: true });
  const after = await at(`/pools/lk-renew/lock/${g.slotId}/renew`, key);
  t.equal(after.status, 404);
  t.equal(after.json.error, 'not_found');
  t.equal((await at('/pools/lk-renew/lock/never-granted-slot/renew', key)).status, 404);
  t.equal(c.governor.state(id).inFlight, 0);
});

t.test('no renewal for one term: the slot is reclaimed, a later renew is 404 and release says released:false', async (t) => {
  // The clock decides: held until one term after the last renewal to the millisecond, however late the
  // machine runs the janitor's timer; reclaimed by the janitor (no request asks) once the term has passed.
  const id = await createPool('lk-reclaim', { maxConcurrent: 1, settings: { leaseTermMs: 1000, renewIntervalMs: 250 } });
  const key = await mintKey('lk-reclaim');
  const c = await lockOnClock(t, [id]);
  const at = (path: string) => post(path, { key, on: c.on });
  const g = (await at('/pools/lk-reclaim/lock/acquire')).json;
  t.equal(g.termMs, 1000);
  t.equal((await at('/pools/lk-reclaim/lock/acquire')).status, 429, 'the pool is full while the lease is held');
  // Renewing keeps it beyond its first term.
  c.advance(500);
  const renewed = await at(`/pools/lk-reclaim/lock/${g.slotId}/renew`);
  t.equal(renewed.status, 200);
  c.advance(999);
  t.equal(c.governor.state(id).inFlight, 1, 'still held: renewed within its term');
  c.advance(1);
  t.equal(c.now(), renewed.json.leaseDeadline, 'the clock is at one term after the last renewal');
  await until('the janitor to reclaim the lease', () => c.governor.state(id).inFlight === 0);
  t.pass('reclaimed one term after the last renewal');
  const r = await at(`/pools/lk-reclaim/lock/${g.slotId}/renew`);
  t.equal(r.status, 404);
  t.equal(r.json.error, 'not_found');
  t.same((await post(`/pools/lk-reclaim/lock/${g.slotId}/release`, { key, on: c.on })).json, { released: false });
  const next = await at('/pools/lk-reclaim/lock/acquire');
  t.equal(next.status, 200, 'the reclaimed slot is free for the next caller');
  await post(`/pools/lk-reclaim/lock/${next.json.slotId}/release`, { key, on: c.on });
});

t.test('release: valid outcome → released:true; again → released:false; an invalid report is 400 and keeps the slot', async (t) => {
  const id = await createPool('lk-release');
  const key = await mintKey('lk-release');
  const g = (await acquire('lk-release', key)).json;
  const invalid: unknown[] = [
    { status: 99 },
    { status: 600 },
    { status: '200' },
    { throttled: -1 },
    { retryAfterMs: 1.5 },
    { rate: { limit: -1 } },
    { rate: { limit: 10, custom: 'x' } },
    { rate: [1] },
    { headers: { 'x-ratelimit-limit': 100 } },
    { headers: { 'bad name': 'x' } },
    { headers: 'retry-after: 1' },
    { statusCode: 200 },
  ];
  for (const body of invalid) {
    const r = await release('lk-release', key, g.slotId, body);
    t.equal(r.status, 400, JSON.stringify(body));
    t.equal(r.json.error, 'bad_request');
    t.type(r.json.message, 'string');
  }
  const malformed = await post(`/pools/lk-release/lock/${g.slotId}/release`, { key, raw: '{"status":', headers: { 'content-type': 'application/json' } });
  t.equal(malformed.status, 400);
  t.equal(dp().governor.state(id).inFlight, 1, 'refused reports released nothing');
  t.equal((await renew('lk-release', key, g.slotId)).status, 200, 'the slot is still held');
  const ok = await release('lk-release', key, g.slotId, {
    status: 200,
    throttled: 0,
    retryAfterMs: 0,
    rate: { limit: 600, remaining: 599, resetMs: 60_000, tokenLimit: 100_000, tokenRemaining: 99_000 },
    headers: { 'X-RateLimit-Limit': '600' },
  });
  t.equal(ok.status, 200);
  t.same(ok.json, { released: true });
  t.same((await release('lk-release', key, g.slotId)).json, { released: false }, 'already gone');
  const bare = (await acquire('lk-release', key)).json;
  t.same((await release('lk-release', key, bare.slotId)).json, { released: true }, 'the body is optional');
  t.equal(dp().governor.state(id).inFlight, 0);
});

t.test('the release outcome reaches the permit: status, throttled, retryAfterMs, rate and lower-cased headers', async (t) => {
  // A lock listener over the service's snapshot whose governor records what each permit is released with.
  const seen: Outcome[] = [];
  const inner = new MemoryGovernor();
  const recording: Governor = {
    configure: (p, b) => inner.configure(p, b),
    state: (id) => inner.state(id),
    close: () => inner.close(),
    acquire(req: AdmitRequest) {
      const a = inner.acquire(req);
      if (a instanceof Promise) throw new Error('unexpected wait');
      if (!a.ok) return a;
      const permit = a.permit;
      return { ...a, permit: { poolId: permit.poolId, release: (o?: Outcome) => (seen.push(o ?? {}), permit.release(o)) } };
    },
  };
  const snapshots = dp().snapshots;
  await createPool('lk-outcome');
  await createPool('lk-outcome-short', { settings: { leaseTermMs: 100 } });
  const key = await mintKey('lk-outcome');
  const shortKey = await mintKey('lk-outcome-short');
  inner.configure([...snapshots.current.pools.values()].map((p) => ({ poolId: p.id, maxConcurrent: p.maxConcurrent, queueLength: 10, queueTimeoutMs: 1000, budgetId: null, reservedConcurrent: 0 })), []);
  const server = await LockServer.start({ host: '127.0.0.1', port: 0, governor: recording, snapshots, log: createLogger('silent'), accessLog: null });
  const client = new Pool(`http://127.0.0.1:${server.port}`);
  t.teardown(async () => {
    await client.close();
    await server.close();
  });
  const g = (await post('/pools/lk-outcome/lock/acquire', { key, on: client })).json;
  await sleep(30);
  const rate = { limit: 600, remaining: 12, resetMs: 30_000, tokenLimit: 5000, tokenRemaining: 4000 };
  const r = await post(`/pools/lk-outcome/lock/${g.slotId}/release`, {
    key,
    on: client,
    body: { status: 429, throttled: 2, retryAfterMs: 1500, rate, headers: { 'Retry-After': '2', 'x-ratelimit-remaining': '0', Constructor: 'c1' } },
  });
  t.same(r.json, { released: true });
  t.equal(seen.length, 1);
  t.match(seen[0], { status: 429, throttled: 2, retryAfterMs: 1500, rate, headers: { 'retry-after': '2', 'x-ratelimit-remaining': '0' } });
  t.equal(seen[0]!.headers!.constructor, 'c1', 'a header named like an Object property is a header like any other');
  t.notOk(seen[0]!.dropped, 'a release is a sample, not dropped work');
  // A lease reclaimed by the janitor is settled as dropped work (another pool: the 429 above shut this one's rate gate).
  const shortRes = await post('/pools/lk-outcome-short/lock/acquire', { key: shortKey, on: client });
  t.equal(shortRes.status, 200, JSON.stringify(shortRes.json));
  const short = shortRes.json;
  t.equal(short.termMs, 100);
  await until('the janitor to settle the unrenewed lease', () => seen.length === 2);
  t.match(seen[1], { dropped: true });
});

t.test('leases and proxy traffic share one limit: held leases block proxy requests, and the reverse', async (t) => {
  const id = await createPool('lk-shared', { maxConcurrent: 2 });
  const key = await mintKey('lk-shared');
  const viaProxy = (path: string, headers: Record<string, string> = {}) =>
    proxy.request({ path, method: 'GET', headers: { host: 'lk-shared.pools.localhost', 'x-service-key': key, ...headers } }).then(async (r) => ({ status: r.statusCode, body: await r.body.text() }));

  const a = (await acquire('lk-shared', key)).json;
  const b = (await acquire('lk-shared', key)).json;
  const before = origin.count;
  const blocked = await viaProxy('/blocked', { 'x-service-no-queue': '1' });
  t.equal(blocked.status, 429, 'two leases fill the pool: proxy traffic is refused');
  t.equal(origin.count, before, 'and never reached the origin');
  // A queued proxy request gets the slot a lease frees.
  const queued = viaProxy('/queued', { 'x-service-queue-timeout-ms': '3000' });
  await until('the proxy request to queue', () => dp().governor.state(id).queued === 1);
  await release('lk-shared', key, a.slotId, { status: 200 });
  t.equal((await queued).status, 200, 'the queued proxy request ran once a lease was released');
  await release('lk-shared', key, b.slotId);

  // The reverse: proxy requests in flight fill the pool; a lock acquire waits for one of them.
  const slow = [viaProxy('/delay/400'), viaProxy('/delay/400')];
  await until('both proxy requests to hold a slot', () => dp().governor.state(id).inFlight === 2);
  const refused = await acquire('lk-shared', key);
  t.equal(refused.status, 429, 'proxied requests hold the slots: fail-fast acquire is refused');
  const waited = await acquire('lk-shared', key, { body: { waitMs: 3000 } });
  t.equal(waited.status, 200, 'a waiting acquire gets the slot a finished proxy request frees');
  t.ok(Number(waited.headers['x-service-queued-ms']) >= 100);
  for (const s of await Promise.all(slow)) t.equal(s.status, 200);
  await release('lk-shared', key, waited.json.slotId);
  t.equal(dp().governor.state(id).inFlight, 0);
});

t.test('a lock release that reports upstream throttling shuts the pool\'s RPM gate for proxy traffic too', async (t) => {
  await createPool('lk-rpm', { maxConcurrent: 5 });
  const key = await mintKey('lk-rpm');
  const viaProxy = () =>
    proxy.request({ path: '/', method: 'GET', headers: { host: 'lk-rpm.pools.localhost', 'x-service-key': key, 'x-service-no-queue': '1' } }).then(async (r) => ({ status: r.statusCode, json: JSON.parse(await r.body.text()) }));
  t.equal((await viaProxy()).status, 200, 'the gate is open before');
  const g = (await acquire('lk-rpm', key)).json;
  t.same((await release('lk-rpm', key, g.slotId, { status: 429, throttled: 1, retryAfterMs: 5000 })).json, { released: true });
  const proxied = await viaProxy();
  t.equal(proxied.status, 429, 'proxy traffic waits out the retry hint a lock client reported');
  t.equal(proxied.json.error, 'too_many_requests');
  const leased = await acquire('lk-rpm', key);
  t.equal(leased.status, 429, 'and so do lock clients');
  t.match(leased.headers['retry-after'], /^\d+$/);
});

t.test('acquire attempts are in the access log; renew and release are not; shutdown frees held leases', async (t) => {
  const id = await createPool('lk-log');
  const key = await mintKey('lk-log');
  const g = (await acquire('lk-log', key)).json;
  await renew('lk-log', key, g.slotId);
  await release('lk-log', key, g.slotId);
  await acquire('lk-log', 'pgk_wrong');
  const kept = (await acquire('lk-log', key)).json;
  t.ok(kept.slotId);
  await svc.service.close();
  t.equal(svc.service.dataplane!.governor.state(id).inFlight, 0, 'shutdown settled the held lease');
  const lines = readFileSync(accessLogFile, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l))
    .filter((l) => l.pool === 'lk-log');
  t.same(lines.map((l) => [l.path, l.status, l.outcome]), [
    ['/pools/lk-log/lock/acquire', 200, 'lease_granted'],
    ['/pools/lk-log/lock/acquire', 401, 'unauthorized'],
    ['/pools/lk-log/lock/acquire', 200, 'lease_granted'],
  ]);
  t.type(lines[0].totalMs, 'number');
  t.equal(lines[0].queuedMs, 0);
});
