// The HMAC nonce store in its two backends: memory (with the memory and shared-memory governors; bounded,
// expiring; full means "cannot check", never "forget a live nonce") and Redis (SET NX PX, with the Redis
// governor), where every node sees every nonce.
import t from 'tap';
import { MemoryNonceStore } from '../src/policies/nonce-store.js';
import { RedisNonceStore } from '../src/policies/redis-nonce-store.js';
import { needServer, REDIS_URL } from './helpers/servers.js';
import { randomBytes } from 'node:crypto';

t.test('memory: a nonce is fresh once, seen until it expires, and the store is bounded', async (t) => {
  let now = 1_000_000;
  const store = new MemoryNonceStore({ maxEntries: 3, clock: () => now });
  t.equal(store.claim('a', 1000), 'fresh');
  t.equal(store.claim('a', 1000), 'seen');
  t.equal(store.claim('b', 1000), 'fresh');
  t.equal(store.claim('c', 5000), 'fresh');
  t.equal(store.claim('d', 1000), 'full', 'at the cap with nothing expired: refuse rather than forget a live nonce');
  now += 1001;
  t.equal(store.claim('a', 1000), 'fresh', 'expired nonces are forgotten');
  t.equal(store.claim('d', 1000), 'fresh', 'and make room');
  t.equal(store.claim('c', 1000), 'seen', 'a longer-lived nonce is still remembered');
  t.ok(store.size <= 3);
});

t.test('redis: two nodes share the nonces; they expire after their TTL', async (t) => {
  const skip = await needServer('redis');
  if (skip) return t.skip(skip);
  const a = new RedisNonceStore(REDIS_URL);
  const b = new RedisNonceStore(REDIS_URL);
  t.teardown(async () => {
    await a.close();
    await b.close();
  });
  const id = `test:${randomBytes(8).toString('hex')}`;
  t.equal(await a.claim(id, 300), 'fresh');
  t.equal(await b.claim(id, 300), 'seen', 'another node sees the nonce');
  await new Promise((r) => setTimeout(r, 400));
  t.equal(await b.claim(id, 300), 'fresh', 'gone after its TTL');
});

t.test('redis through the data plane: with redisUrl set, a replay is refused by every node', async (t) => {
  const skip = await needServer('redis');
  if (skip) return t.skip(skip);
  const { startTestService } = await import('./helpers/service.js');
  const { startOrigin } = await import('./helpers/origin.js');
  const { signRequest } = await import('../src/index.js');
  const { Pool } = await import('undici');
  const origin = await startOrigin();
  const nodes = [];
  for (let i = 0; i < 2; i++) {
    nodes.push(await startTestService({ engine: 'postgres', overrides: { originCaFile: origin.caFile, accessLogFile: '/dev/null', redisUrl: REDIS_URL } }));
  }
  t.teardown(async () => {
    for (const n of nodes) await n.close();
    await origin.close();
  });
  // Two services on two fresh databases stand in for two nodes: the pool and key are copied across, so
  // the only thing they share is Redis.
  const [a, b] = nodes as [Awaited<ReturnType<typeof startTestService>>, Awaited<ReturnType<typeof startTestService>>];
  const keys: string[] = [];
  const secrets: string[] = [];
  for (const n of [a, b]) {
    const boot = await n.bootstrap({ team: 'same' });
    await n.service.sql.query(
      `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, settings) VALUES ($1, 'sig', 'sig', 'http', $2, $3, '{"originSigning":true}')`,
      [boot.team.id, origin.url, new URL(origin.url).host],
    );
    const res = await n.api('POST', '/api/v1/pools/sig/keys', { token: boot.token, body: {} });
    keys.push(res.body.data.key);
    secrets.push(res.body.data.signing_secret);
  }
  // Node b's key row takes node a's key and secret (same pool id, same key id on both fresh databases).
  const { sha256Hex, lastFour } = await import('../src/security/tokens.js');
  await b.service.sql.query('UPDATE pool_keys SET key_hash = $1, last_four = $2, signing_secret_enc = $3', [sha256Hex(keys[0]!), lastFour(keys[0]!), b.service.box.seal(secrets[0]!)]);
  await b.service.dataplane!.snapshots.reload();
  await a.service.dataplane!.snapshots.reload();
  const headers = { host: 'sig.pools.localhost', 'x-service-key': keys[0]!, ...signRequest({ secret: secrets[0]!, method: 'GET', target: '/r' }) };
  const pa = new Pool(a.proxyUrl!);
  const pb = new Pool(b.proxyUrl!);
  t.teardown(async () => {
    await pa.close();
    await pb.close();
  });
  const first = await pa.request({ path: '/r', method: 'GET', headers });
  await first.body.text();
  t.equal(first.statusCode, 200, 'node a admits the signed request');
  const again = await pb.request({ path: '/r', method: 'GET', headers });
  const body = (await again.body.json()) as { message: string };
  t.equal(again.statusCode, 401, 'node b refuses the same nonce');
  t.equal(body.message, 'nonce replay');
});

