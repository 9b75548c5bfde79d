// Issue 27 item 2, the open policy's hand-back: slots the fail-open fallback granted while Redis was away are
// written to Redis as leases once it answers again, and until they are, the pool keeps admitting on the local
// limit. A slot the fallback granted after Redis was back (a caller that waited in the fallback's queue) was not
// in Redis until the next lease refresh (a third of a term later), and an admission through Redis meanwhile put
// the origin over max_concurrent (seen: 7 of 6 after a Cluster failover).
import t from 'tap';
import { Redis } from 'ioredis';
import { RedisGovernor } from '../src/governor/redis.js';
import type { Admission, Permit } from '../src/governor/governor.js';
import { pool } from './helpers/governor-suite.js';
import { needServer } from './helpers/servers.js';
import { freePort, startRedisServer } from './helpers/redis-server.js';
import { until } from './helpers/until.js';

function permit(a: Admission): Permit {
  if (!a.ok) throw new Error(`refused: ${a.reason}`);
  return a.permit;
}

t.test('open policy: the fallback\'s slots are leases in Redis before the pool admits through Redis again', { skip: await needServer('redis') }, async (t) => {
  const port = await freePort();
  let proc = await startRedisServer(port);
  t.teardown(() => void proc.kill('SIGKILL'));
  const url = `redis://127.0.0.1:${port}`;
  const gov = new RedisGovernor({ url, prefix: 'handback:', failurePolicy: 'open', failOpenDivisor: 1, termMs: 30_000 });
  t.teardown(() => gov.close());
  await gov.ready();
  gov.configure([pool(1, { maxConcurrent: 1, queueTimeoutMs: 10_000 })], []);

  proc.kill('SIGKILL');
  await until('the governor to see Redis gone', () => !gov.connected, 5000);
  const a = permit(await gov.acquire({ poolId: 1, waitMs: 0 }));
  // Waits in the fallback's queue for the one local slot; it gets it only after Redis is back.
  const waiting = gov.acquire({ poolId: 1, waitMs: 10_000 });

  proc = await startRedisServer(port);
  await until('reconnected', () => gov.connected, 5000);
  const probe = new Redis(url);
  t.teardown(() => probe.disconnect());
  const slots = gov.leaseKeys(1)!.slots;
  await until('the held fallback slot written back', async () => (await probe.zcard(slots)) === 1, 5000);

  a.release();
  const b = permit(await waiting);
  // b is the fallback's, not in Redis yet: an admission through Redis now would make two of max 1.
  t.match(await gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false }, 'no second slot while the fallback still holds one that Redis does not count');
  await until('the late fallback slot written back', async () => (await probe.zcard(slots)) === 1, 5000);
  t.match(await gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' }, 'through Redis, the fallback\'s slot counts against max_concurrent');
  b.release();
  await until('its lease removed at its release', async () => (await probe.zcard(slots)) === 0, 5000);
  const c = permit(await gov.acquire({ poolId: 1, waitMs: 0 }));
  t.equal(gov.state(1).inFlight, 1, 'back on Redis');
  c.release();
});
