// The Governor contract against the Redis governor, plus what only it promises: leases shared by every node,
// reclaimed after one term when a node dies, the node line that keeps nodes from starving each other, the
// stored effective limit, lock API leases, and surviving a Redis restart (fail closed / fail open).
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { RedisGovernor, type RedisGovernorOptions } from '../src/governor/redis.js';
import { RedisLeaseRegistry } from '../src/lock/redis-leases.js';
import { REFRESH } from '../src/governor/redis-scripts.js';
import type { Admission, Permit } from '../src/governor/governor.js';
import { governorSuite, pool } from './helpers/governor-suite.js';
import { needServer, REDIS_URL } from './helpers/servers.js';
import { freePort, startRedisServer } from './helpers/redis-server.js';
import { sleep, until } from './helpers/until.js';

const RUN = `pgtest:${randomBytes(4).toString('hex')}:`;
let n = 0;

async function make(over: RedisGovernorOptions = {}): Promise<RedisGovernor> {
  const gov = new RedisGovernor({ url: REDIS_URL, prefix: `${RUN}${++n}:`, ...over });
  await gov.ready();
  return gov;
}

function permit(a: Admission): Permit {
  if (!a.ok) throw new Error(`expected an admission, got ${a.reason}`);
  return a.permit;
}


t.test('redis governor', { skip: await needServer('redis') }, async (t) => {
  const admin = new Redis(REDIS_URL);
  t.teardown(async () => {
    // Every key this run wrote lives under its own prefix.
    const keys = await admin.keys(`${RUN}*`);
    if (keys.length > 0) await admin.del(...keys);
    admin.disconnect();
  });

  t.test('the Governor contract', async (t) => {
    governorSuite(t, () => make());
  });

  t.test('two nodes share one limit; a released slot wakes the other node at once', async (t) => {
    const prefix = `${RUN}shared:`;
    const a = await make({ prefix, retryMs: 5000 });
    const b = await make({ prefix, retryMs: 5000 });
    t.teardown(async () => {
      await a.close();
      await b.close();
    });
    a.configure([pool(1, { maxConcurrent: 2 })], []);
    b.configure([pool(1, { maxConcurrent: 2 })], []);
    const p1 = permit(await a.acquire({ poolId: 1, waitMs: 0 }));
    const p2 = permit(await b.acquire({ poolId: 1, waitMs: 0 }));
    t.match(await a.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' }, 'node A sees node B holding the second slot');
    const started = performance.now();
    const waiting = b.acquire({ poolId: 1, waitMs: 3000 });
    await until("node B's caller to wait", () => b.state(1).queued === 1);
    p1.release();
    const got = await waiting;
    t.ok(got.ok, 'node B admitted after node A released');
    // The fallback retry is 5 s here: only the pub/sub wake-up explains a fast admission.
    t.ok(performance.now() - started < 1000, `woken by pub/sub (${Math.round(performance.now() - started)} ms)`);
    permit(got).release();
    p2.release();
  });

  t.test("a node that dies without releasing loses its slots after one term, and nobody else's", async (t) => {
    const prefix = `${RUN}dead:`;
    const dead = await make({ prefix, termMs: 300 });
    const live = await make({ prefix, termMs: 300 });
    t.teardown(() => live.close());
    dead.configure([pool(1, { maxConcurrent: 2 })], []);
    live.configure([pool(1, { maxConcurrent: 2 })], []);
    permit(await dead.acquire({ poolId: 1, waitMs: 0 }));
    const mine = permit(await live.acquire({ poolId: 1, waitMs: 0 }));
    // Kill the node: its connection goes, no release is sent, no refresh runs.
    dead.redis.disconnect();
    await sleep(150);
    t.match(await live.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' }, 'within the term the dead slot still counts');
    await sleep(700);
    // The live node's own lease outlived several terms: it was refreshed.
    const back = permit(await live.acquire({ poolId: 1, waitMs: 0 }));
    t.match(await live.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' }, "the live node's slot was kept alive");
    back.release();
    mine.release();
    await dead.close();
  });

  // A refresh of a node's leases can reach Redis after a release sent later: a Cluster client sends a command that
  // met a failover again, to the new primary, after a delay (a soak run of redis-cluster-failover found two leases
  // left for a term after the traffic had stopped). Here the refresh after a reconnect is held in the client while
  // the lease is released; a release that is not sent again after the refresh's answer leaves the slot taken for
  // the whole term.
  t.test('a lease released while a refresh of it is on its way stays released (the refresh lands last)', async (t) => {
    const prefix = `${RUN}refresh-race:`;
    const gov = await make({ prefix, termMs: 60_000 });
    t.teardown(() => gov.close());
    gov.configure([pool(1, { maxConcurrent: 2 })], []);
    const p = permit(await gov.acquire({ poolId: 1, waitMs: 0 }));
    const [slots] = (await admin.keys(`${prefix}*`)).filter((k) => k.endsWith(':slots'));
    t.ok(slots, 'the pool has a slots key');
    t.equal(await admin.zcard(slots!), 1, 'the lease is in Redis');

    // The client holds the next REFRESH until the test lets it go.
    const client = gov.redis as Redis;
    const evalsha = client.evalsha.bind(client) as (...a: unknown[]) => Promise<unknown>;
    let let_go: () => void = () => {};
    const gate = new Promise<void>((r) => (let_go = r));
    let held = 0;
    let answered = 0;
    (client as unknown as { evalsha: (...a: unknown[]) => Promise<unknown> }).evalsha = (...a: unknown[]) => {
      if (a[0] !== REFRESH.sha) return evalsha(...a);
      held++;
      return gate.then(() => evalsha(...a)).finally(() => answered++);
    };
    // A reconnect writes this node's leases back (Redis may have lost them): a REFRESH.
    const id = await client.client('ID');
    await admin.client('KILL', 'ID', String(id));
    await until('the refresh held', () => held > 0);
    p.release();
    await until('the release applied', async () => (await admin.zcard(slots!)) === 0);
    let_go();
    await until('the refresh answered', () => answered > 0);
    await until('no lease left after the refresh', async () => (await admin.zcard(slots!)) === 0, 5000);
    t.pass('the slot is free within moments, not after the 60 s term');
    client.evalsha = evalsha as typeof client.evalsha;
  });

  t.test('scripts are called by hash and loaded again after SCRIPT FLUSH (NOSCRIPT)', async (t) => {
    const gov = await make();
    t.teardown(() => gov.close());
    gov.configure([pool(1)], []);
    permit(await gov.acquire({ poolId: 1, waitMs: 0 })).release();
    // The release has reached Redis (it leaves at the end of the turn; a PING behind it on the same connection
    // answers after it), so the flush below is what the next acquire meets, not a race with that release.
    await new Promise((r) => setImmediate(r));
    await gov.redis.ping();
    await admin.script('FLUSH');
    const again = await gov.acquire({ poolId: 1, waitMs: 0 });
    t.match(again, { ok: true }, 'admitted after the scripts were flushed');
    permit(again).release();
    await new Promise((r) => setImmediate(r));
    await gov.redis.ping(); // answered after the release that left at the end of the turn
    t.equal(gov.state(1).inFlight, 0, 'the release script was reloaded too');
  });

  t.test('the stored effective limit caps every node: min(maxConcurrent, effective)', async (t) => {
    const prefix = `${RUN}eff:`;
    const a = await make({ prefix });
    const b = await make({ prefix });
    t.teardown(async () => {
      await a.close();
      await b.close();
    });
    a.configure([pool(1, { maxConcurrent: 5 })], []);
    b.configure([pool(1, { maxConcurrent: 5 })], []);
    await a.setEffectiveLimit(1, 1);
    const p = permit(await b.acquire({ poolId: 1, waitMs: 0 }));
    t.match(await b.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' }, "node B obeys node A's effective limit");
    t.equal(b.state(1).effectiveLimit, 1);
    await a.setEffectiveLimit(1, 50);
    const q = permit(await b.acquire({ poolId: 1, waitMs: 0 }));
    t.equal(b.state(1).effectiveLimit, 5, 'never above maxConcurrent');
    await a.setEffectiveLimit(1, null);
    p.release();
    q.release();
  });

  t.test('lock API leases: acquired on one node, renewed and released on another', async (t) => {
    const prefix = `${RUN}lease:`;
    const a = await make({ prefix });
    const b = await make({ prefix });
    t.teardown(async () => {
      await a.close();
      await b.close();
    });
    a.configure([pool(1)], []);
    b.configure([pool(1)], []);
    const got = await a.acquireLease({ poolId: 1, waitMs: 0, termMs: 200, leaseId: 'slot-abc' });
    if (!got.ok) throw new Error(got.reason);
    t.equal(got.lease.leaseId, 'slot-abc', "the caller's slot id names the lease");
    t.ok(got.lease.deadline > Date.now() - 1000, 'deadline on the Redis clock (Unix ms)');
    t.match(await b.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' });
    t.equal(await b.renewLease(1, got.lease.leaseId, Date.now() + 500), true, 'renewed from node B');
    await sleep(300);
    t.match(await b.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' }, 'the renewal outlived the first term');
    t.equal(await b.releaseLease(1, got.lease.leaseId), true, 'released from node B');
    t.equal(await a.releaseLease(1, got.lease.leaseId), false, 'a second release finds it gone');
    t.equal(await a.renewLease(1, got.lease.leaseId, Date.now() + 500), false, 'a gone lease is not revived');
    const unrenewed = await a.acquireLease({ poolId: 1, waitMs: 0, termMs: 100 });
    t.ok(unrenewed.ok);
    await sleep(200);
    permit(await b.acquire({ poolId: 1, waitMs: 0 })).release();
    t.pass('a lease nobody renews is reclaimed after its term');
  });

  t.test("a lock lease released on another node is that node's latency sample (hold time on Redis's clock)", async (t) => {
    const prefix = `${RUN}lease-sample:`;
    const a = await make({ prefix });
    const b = await make({ prefix });
    t.teardown(async () => {
      await a.close();
      await b.close();
    });
    a.configure([pool(1, { maxConcurrent: 10, adaptive: true })], []);
    b.configure([pool(1, { maxConcurrent: 10, adaptive: true })], []);
    // The lock API's lease registry (src/lock/redis-leases.ts) keeps the cap beside the governor's lease.
    const terms = { termMs: 5000, requestTimeoutMs: 60_000 };
    const got = await new RedisLeaseRegistry(a).acquire({ poolId: 1, waitMs: 0 }, terms);
    if (!got.ok) throw new Error(got.reason);
    await sleep(150);
    t.equal(b.learned(1)?.shortRttMs, 0, 'node B has no sample yet');
    t.equal(await new RedisLeaseRegistry(b).release(1, got.lease.slotId, { status: 200 }, terms), true, 'released on node B');
    await b.redis.ping();
    const rtt = b.learned(1)!.shortRttMs;
    t.ok(rtt >= 100 && rtt < 30_000, `node B took the hold time as its sample (${rtt} ms)`);
    t.equal(await a.redis.exists(`${prefix}{p:1}:1:lease:${got.lease.slotId}`), 0, "the lease's cap went with it");
  });

  t.test('nodes take turns: under contention no node starves', async (t) => {
    const prefix = `${RUN}fair:`;
    const nodes = await Promise.all([0, 1, 2, 3].map(() => make({ prefix })));
    t.teardown(() => Promise.all(nodes.map((g) => g.close())));
    for (const g of nodes) g.configure([pool(1, { maxConcurrent: 4, queueLength: 1000 })], []);
    const admitted = [0, 0, 0, 0];
    let holding = 0;
    let peak = 0;
    const end = performance.now() + 2000;
    // Each node runs 25 clients in a loop: acquire (waiting), hold 5 ms, release. Node 0 gets a head start.
    const client = async (i: number) => {
      while (performance.now() < end) {
        const a = await nodes[i]!.acquire({ poolId: 1, waitMs: 5000 });
        if (!a.ok) continue;
        admitted[i]!++;
        peak = Math.max(peak, ++holding);
        await sleep(5);
        holding--;
        a.permit.release();
      }
    };
    const runs: Promise<void>[] = [];
    for (let c = 0; c < 25; c++) runs.push(client(0));
    await sleep(50);
    for (const i of [1, 2, 3]) for (let c = 0; c < 25; c++) runs.push(client(i));
    await Promise.all(runs);
    const total = admitted.reduce((s, x) => s + x, 0);
    const min = Math.min(...admitted);
    const max = Math.max(...admitted);
    t.comment(`admissions per node: ${admitted.join(' / ')} (total ${total}, max/min ${(max / Math.max(1, min)).toFixed(2)})`);
    t.ok(peak <= 4, `never more than the limit held at once across the nodes (peak ${peak})`);
    t.ok(min > 0, 'every node was admitted');
    t.ok(max / Math.max(1, min) < 2, 'no node got more than twice the admissions of another');
  });
});

/** A port nobody listens on now. */

t.test('Redis killed and restarted', { skip: await needServer('redis') }, async (t) => {
  const port = await freePort();
  let proc = await startRedisServer(port);
  t.teardown(() => {
    proc.kill('SIGKILL');
  });
  const url = `redis://127.0.0.1:${port}`;

  t.test('fail closed: unavailable (backendDown) while down; leases written back after the restart', async (t) => {
    const gov = new RedisGovernor({ url, prefix: 'closed:', termMs: 3000 });
    t.teardown(() => gov.close());
    await gov.ready();
    gov.configure([pool(1, { maxConcurrent: 2 })], []);
    const held = permit(await gov.acquire({ poolId: 1, waitMs: 0 }));
    const blocked = permit(await gov.acquire({ poolId: 1, waitMs: 0 }));
    const waiter = gov.acquire({ poolId: 1, waitMs: 10_000 });
    await until('the third caller to wait', () => gov.state(1).queued === 1);
    proc.kill('SIGKILL');
    t.match(await waiter, { ok: false, reason: 'unavailable', backendDown: true }, 'a waiter is refused when Redis goes');
    await until('the governor to see Redis go', () => !gov.connected);
    t.match(await gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'unavailable', backendDown: true });
    // Released while Redis is down: sent once it is back.
    blocked.release();
    proc = await startRedisServer(port);
    await until('the governor to reconnect by itself', () => gov.connected);
    const probe = new Redis(url);
    t.teardown(() => probe.disconnect());
    // The restarted Redis is empty: the lease still held was written back, the released one was not.
    const slots = await until('the held lease to be written back', async () => {
      const k = await probe.keys('closed:*slots');
      return k.length > 0 && k;
    });
    t.equal(slots.length, 1);
    t.equal(await probe.zcard(slots[0]!), 1, 'exactly the one held lease is counted: none leaked, none double-counted');
    const again = permit(await gov.acquire({ poolId: 1, waitMs: 0 }));
    t.match(await gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' }, 'the held lease still counts against the limit');
    again.release();
    held.release();
    await until('both releases to reach Redis', async () => (await probe.zcard(slots[0]!)) === 0);
    t.pass('all released');
  });

  t.test('fail open: a per-node local limit while Redis is down', async (t) => {
    const gov = new RedisGovernor({ url, prefix: 'open:', failurePolicy: 'open', failOpenDivisor: 2 });
    t.teardown(() => gov.close());
    await gov.ready();
    gov.configure([pool(1, { maxConcurrent: 4 })], []);
    proc.kill('SIGKILL');
    await until('the governor to see Redis go', () => !gov.connected);
    const a = permit(await gov.acquire({ poolId: 1, waitMs: 0 }));
    const b = permit(await gov.acquire({ poolId: 1, waitMs: 0 }));
    t.match(await gov.acquire({ poolId: 1, waitMs: 0 }), { ok: false, reason: 'no_slot' }, 'local limit 4 / 2 = 2');
    a.release();
    b.release();
    proc = await startRedisServer(port);
    await until('the governor to reconnect', () => gov.connected);
    const c = permit(await gov.acquire({ poolId: 1, waitMs: 0 }));
    t.equal(gov.state(1).inFlight, 1, 'back on Redis');
    c.release();
  });
});
