// The lock API on two dataplane nodes sharing one PostgreSQL store and one Redis: a slot acquired on node A
// is renewed and released on node B, the request-timeout cap holds on B, a reclaimed slot is 404 on both,
// and held slots count against the pool's limit on every node. While Redis is down, every lock call is 503.
import t from 'tap';
import { once } from 'node:events';
import { Redis } from 'ioredis';
import { Pool } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { needServer, REDIS_URL } from './helpers/servers.js';
import { freePort, startRedisServer } from './helpers/redis-server.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { RedisGovernor } from '../src/governor/redis.js';
import { sleep, until } from './helpers/until.js';

/** A database index of its own, flushed at start: pool ids of a fresh store would meet older runs' keys. */
const LOCK_REDIS = `${REDIS_URL}/12`;

for (const name of ['redis', 'postgres'] as const) {
  const why = await needServer(name);
  if (why) {
    t.skip(why);
    process.exit(0);
  }
}

const flush = new Redis(LOCK_REDIS);
await flush.flushdb();
await flush.quit();

let a: TestService;
let b: TestService;
let lockA: Pool;
let lockB: Pool;
let teamId: number;
let token: string;

t.before(async () => {
  const overrides = { redisUrl: LOCK_REDIS, governorLeaseTermMs: 30_000 };
  a = await startTestService({ engine: 'postgres', overrides });
  b = await startTestService({ roles: ['control', 'dataplane'], dataDir: a.config.dataDir, overrides: { ...overrides, databaseUrl: a.config.databaseUrl } });
  const boot = await a.bootstrap();
  teamId = boot.team.id;
  token = boot.token;
  lockA = new Pool(a.lockUrl!, { connections: 8 });
  lockB = new Pool(b.lockUrl!, { connections: 8 });
});
t.teardown(async () => {
  await lockA?.close();
  await lockB?.close();
  await b?.close();
  await a?.close();
});

async function reloadBoth(): Promise<void> {
  await a.service.dataplane!.snapshots.reload();
  await b.service.dataplane!.snapshots.reload();
}

/** A pool made with SQL (lease settings are not in the Control API), with one key, seen by both nodes. */
async function createPool(sub: string, maxConcurrent: number, settings: Record<string, unknown>): Promise<string> {
  const sql = a.service.sql;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, $2, $3, 'http', 'https://origin.example', 'origin.example', $4, true, $5::jsonb) RETURNING id`,
    [teamId, sub, sub, maxConcurrent, JSON.stringify(settings)],
  );
  await sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await reloadBoth();
  const res = await a.api('POST', `/api/v1/pools/${sub}/keys`, { token, body: {} });
  if (res.status !== 201) throw new Error(`mint failed: ${res.status} ${JSON.stringify(res.body)}`);
  await reloadBoth();
  return res.body.data.key;
}

async function post(on: Pool, path: string, key: string): Promise<{ status: number; json: any }> {
  const res = await on.request({ path, method: 'POST', headers: { 'x-service-key': key } });
  return { status: res.statusCode, json: JSON.parse(await res.body.text()) };
}

t.test('a slot acquired on A is renewed and released on B, and counts on both', async (t) => {
  const key = await createPool('ln-cross', 1, { leaseTermMs: 2000, renewIntervalMs: 500, requestTimeoutMs: 60_000 });
  const g = await post(lockA, '/pools/ln-cross/lock/acquire', key);
  t.equal(g.status, 200, 'granted on A');
  const slot = g.json.slotId as string;

  const fullOnB = await post(lockB, '/pools/ln-cross/lock/acquire', key);
  t.equal(fullOnB.status, 429, 'the one slot held on A fills the pool on B too');

  const r = await post(lockB, `/pools/ln-cross/lock/${slot}/renew`, key);
  t.equal(r.status, 200, 'renewed on B');
  t.ok(r.json.leaseDeadline > g.json.leaseDeadline, 'the renewal moved the deadline');

  const rel = await post(lockB, `/pools/ln-cross/lock/${slot}/release`, key);
  t.same(rel.json, { released: true }, 'released on B');
  const again = await post(lockA, `/pools/ln-cross/lock/${slot}/release`, key);
  t.same(again.json, { released: false }, 'a second release on A finds it gone');
  const renewGone = await post(lockA, `/pools/ln-cross/lock/${slot}/renew`, key);
  t.equal(renewGone.status, 404, 'renewing the released slot on A is 404');

  const next = await post(lockA, '/pools/ln-cross/lock/acquire', key);
  t.equal(next.status, 200, 'the freed slot is granted again');
  await post(lockA, `/pools/ln-cross/lock/${next.json.slotId}/release`, key);
});

t.test('the request-timeout cap set on A is enforced on B', async (t) => {
  const key = await createPool('ln-cap', 2, { leaseTermMs: 1000, renewIntervalMs: 200, requestTimeoutMs: 1500 });
  const g = await post(lockA, '/pools/ln-cap/lock/acquire', key);
  t.equal(g.status, 200);
  t.equal(g.json.requestDeadline - g.json.leaseDeadline, 500, 'requestDeadline = grant + requestTimeoutMs (one term before it)');
  const slot = g.json.slotId as string;
  await sleep(600);
  const r = await post(lockB, `/pools/ln-cap/lock/${slot}/renew`, key);
  t.equal(r.status, 200, 'renewed on B');
  t.equal(r.json.leaseDeadline, g.json.requestDeadline, 'B stops the renewal at the request deadline A set');
  const capped = await post(lockB, `/pools/ln-cap/lock/${slot}/renew`, key);
  t.equal(capped.status, 409, 'B answers capped');
  t.equal(capped.json.error, 'capped');
  const cappedA = await post(lockA, `/pools/ln-cap/lock/${slot}/renew`, key);
  t.equal(cappedA.status, 409, 'and so does A');
  const rel = await post(lockA, `/pools/ln-cap/lock/${slot}/release`, key);
  t.same(rel.json, { released: true }, 'a capped slot is still held until released');
});

t.test('a slot not renewed within its term is reclaimed: 404 on both nodes, and its slot is free', async (t) => {
  const key = await createPool('ln-reclaim', 1, { leaseTermMs: 300, renewIntervalMs: 100, requestTimeoutMs: 60_000 });
  const g = await post(lockA, '/pools/ln-reclaim/lock/acquire', key);
  t.equal(g.status, 200);
  const slot = g.json.slotId as string;
  await sleep(450);
  const onB = await post(lockB, `/pools/ln-reclaim/lock/${slot}/renew`, key);
  t.equal(onB.status, 404, 'B: reclaimed');
  const onA = await post(lockA, `/pools/ln-reclaim/lock/${slot}/renew`, key);
  t.equal(onA.status, 404, 'A: reclaimed');
  const rel = await post(lockA, `/pools/ln-reclaim/lock/${slot}/release`, key);
  t.same(rel.json, { released: false }, 'releasing a reclaimed slot is released: false');
  const fresh = await post(lockB, '/pools/ln-reclaim/lock/acquire', key);
  t.equal(fresh.status, 200, 'the reclaimed slot is granted again, on B');
  await post(lockB, `/pools/ln-reclaim/lock/${fresh.json.slotId}/release`, key);
});

t.test('a slot of one pool is not found through another pool, on either node', async (t) => {
  const k1 = await createPool('ln-own', 1, { leaseTermMs: 5000, renewIntervalMs: 1000 });
  const k2 = await createPool('ln-other', 1, { leaseTermMs: 5000, renewIntervalMs: 1000 });
  const g = await post(lockA, '/pools/ln-own/lock/acquire', k1);
  const slot = g.json.slotId as string;
  t.equal((await post(lockB, `/pools/ln-other/lock/${slot}/renew`, k2)).status, 404, 'renew through another pool: 404');
  t.same((await post(lockB, `/pools/ln-other/lock/${slot}/release`, k2)).json, { released: false }, 'release through another pool: false');
  t.same((await post(lockB, `/pools/ln-own/lock/${slot}/release`, k1)).json, { released: true }, 'still held by its own pool');
});


t.test('while Redis is down, acquire, renew and release answer 503', async (t) => {
  const port = await freePort();
  let redis = await startRedisServer(port);
  const svc = await startTestService({ overrides: { redisUrl: `redis://127.0.0.1:${port}` } });
  const client = new Pool(svc.lockUrl!, { connections: 4 });
  t.teardown(async () => {
    await client.close();
    await svc.close();
    redis.kill('SIGKILL');
  });
  const boot = await svc.bootstrap();
  const sql = svc.service.sql;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, 'ln-down', 'ln-down', 'http', 'https://origin.example', 'origin.example', 1, true, $2::jsonb) RETURNING id`,
    [boot.team.id, JSON.stringify({ leaseTermMs: 30_000 })],
  );
  await sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await svc.service.dataplane!.snapshots.reload();
  const minted = await svc.api('POST', '/api/v1/pools/ln-down/keys', { token: boot.token, body: {} });
  const key = minted.body.data.key as string;
  await svc.service.dataplane!.snapshots.reload();

  const g = await post(client, '/pools/ln-down/lock/acquire', key);
  t.equal(g.status, 200, 'granted while Redis is up');
  const slot = g.json.slotId as string;
  redis.kill('SIGKILL');
  await once(redis, 'exit');
  const governor = svc.service.dataplane!.governor;
  t.type(governor, RedisGovernor);
  await until('the governor to see Redis go', () => !(governor as RedisGovernor).connected);

  const renew = await post(client, `/pools/ln-down/lock/${slot}/renew`, key);
  t.equal(renew.status, 503, 'renew: 503');
  t.equal(renew.json.error, 'unavailable');
  const release = await post(client, `/pools/ln-down/lock/${slot}/release`, key);
  t.equal(release.status, 503, 'release: 503 (the caller cannot know whether its slot is held)');
  const acquire = await post(client, '/pools/ln-down/lock/acquire', key);
  t.equal(acquire.status, 503, 'acquire: 503');
});
