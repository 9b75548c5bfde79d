// The HMAC nonce store in both governor backends: memory (bounded, expiring; full means "cannot
// check", never "forget a live nonce") and Redis (SET NX PX), where every node sees every nonce.
import t from 'tap';
import { MemoryNonceStore, RedisNonceStore } from '../src/policies/nonce-store.js';
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
