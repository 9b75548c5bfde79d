// What the Redis governor's nodes learn from releases holds on every node: a retry hint pauses the pool
// everywhere, the RPM gate (fixed or learned) is one bucket in Redis shared by all nodes, and a node's
// adaptive controller publishes its limit for the others.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { RedisGovernor } from '../src/governor/redis.js';
import type { Admission, PoolLimits } from '../src/governor/governor.js';
import { needServer, REDIS_URL } from './helpers/servers.js';
import { until } from './helpers/until.js';

const RUN = `pgtest-learn:${randomBytes(4).toString('hex')}:`;
let n = 0;

function limits(over: Partial<PoolLimits> = {}): PoolLimits {
  return { poolId: 1, maxConcurrent: 10, queueLength: 10, queueTimeoutMs: 5000, budgetId: null, reservedConcurrent: 0, ...over };
}

/**
 * Two nodes on one prefix (one Redis), both configured with `l`, and the Redis key of pool 1's `name` (pause,
 * rate, eff) under that prefix: what a node publishes is awaited there, not slept for.
 */
async function twoNodes(t: { teardown(fn: () => Promise<void>): void }, l: PoolLimits): Promise<[RedisGovernor, RedisGovernor, (name: string) => string]> {
  const prefix = `${RUN}${++n}:`;
  const nodes: RedisGovernor[] = [];
  for (let i = 0; i < 2; i++) {
    const gov = new RedisGovernor({ url: REDIS_URL, prefix, retryMs: 20 });
    await gov.ready();
    gov.configure([l], []);
    nodes.push(gov);
  }
  t.teardown(async () => {
    for (const g of nodes) await g.close();
  });
  return [nodes[0]!, nodes[1]!, (name) => `${prefix}{p:1}:1:${name}`];
}

async function take(gov: RedisGovernor, waitMs = 0): Promise<Admission> {
  return gov.acquire({ poolId: 1, waitMs });
}

t.test('learning with the Redis governor', { skip: await needServer('redis') }, async (t) => {
  const admin = new Redis(REDIS_URL);
  t.teardown(async () => {
    const keys = await admin.keys(`${RUN}*`);
    if (keys.length > 0) await admin.del(...keys);
    admin.disconnect();
  });

  t.test('a retry hint reported on node A pauses the pool on node B, then it opens again', async (t) => {
    const [a, b, key] = await twoNodes(t, limits());
    const first = await take(a);
    if (!first.ok) throw new Error('first acquire refused');
    first.permit.release({ status: 429, retryAfterMs: 600 });
    await until('the pause to reach Redis (auto-pipelined, not awaited by release)', () => admin.exists(key('pause')));
    const onB = await take(b);
    t.equal(onB.ok, false, 'B refuses while paused');
    if (!onB.ok) {
      t.equal(onB.reason, 'rate_limited');
      t.ok(onB.retryAfterMs! >= 1000, 'with a retry hint in whole seconds');
    }
    t.equal(b.state(1).remaining, 0, "B's headers show no remaining slot while the gate is shut");
    const onA = await take(a);
    t.equal(onA.ok, false, 'and so does A');
    const waited = await take(b, 2000);
    t.equal(waited.ok, true, 'a waiter on B is admitted once the pause ends');
    if (waited.ok) {
      t.ok(waited.queuedMs >= 300, `it waited for the pause (${Math.round(waited.queuedMs)} ms)`);
      waited.permit.release({ status: 200 });
    }
    const short = await take(b, 0);
    t.equal(short.ok, true, 'after the pause B admits at once');
    if (short.ok) short.permit.release();
  });

  t.test('a fixed RPM is one bucket for all nodes', async (t) => {
    // 120/min: a bucket of 2 requests refilled at 2 per second, whichever node takes them.
    const [a, b] = await twoNodes(t, limits({ rpmOverride: 120 }));
    const started = performance.now();
    let admitted = 0;
    let limited = 0;
    for (let i = 0; i < 10; i++) {
      const r = await take(i % 2 === 0 ? a : b);
      if (r.ok) {
        admitted++;
        r.permit.release({ status: 200 });
      } else if (r.reason === 'rate_limited') limited++;
    }
    const elapsed = performance.now() - started;
    const allowed = 2 + Math.floor((elapsed * 2) / 1000);
    t.ok(admitted >= 2 && admitted <= allowed, `admitted ${admitted} of 10 across both nodes in ${Math.round(elapsed)} ms (at most ${allowed})`);
    t.equal(admitted + limited, 10, 'every other attempt was refused as rate_limited');
  });

  t.test('an RPM learned from rate headers on node A gates node B', async (t) => {
    const [a, b, key] = await twoNodes(t, limits());
    const p = await take(a);
    if (!p.ok) throw new Error('first acquire refused');
    // 60 per minute: the gate runs at 0.97 of it, a bucket of one request.
    p.permit.release({ status: 200, headers: { 'x-ratelimit-limit-requests': '60', 'x-ratelimit-remaining-requests': '59' } });
    await until('the learned RPM to reach Redis', () => admin.hexists(key('rate'), 'rpm'));
    const results: Admission[] = [];
    for (let i = 0; i < 4; i++) results.push(await take(b));
    const ok = results.filter((r) => r.ok).length;
    t.ok(ok <= 1, `B admitted ${ok} of 4 back-to-back requests`);
    t.ok(results.some((r) => !r.ok && r.reason === 'rate_limited'), 'the rest are rate_limited');
    for (const r of results) if (r.ok) r.permit.release();
  });

  t.test("node A's adaptive limit, lowered by throttling, is the limit on node B", async (t) => {
    const [a, b, key] = await twoNodes(t, limits({ adaptive: true, maxConcurrent: 10 }));
    const p = await take(a);
    if (!p.ok) throw new Error('first acquire refused');
    // A 429 without rate headers is a concurrency signal: the limit backs off (×0.9).
    p.permit.release({ status: 429, latencyMs: 20 });
    await until("A's lowered limit to reach Redis", async () => (await admin.get(key('eff'))) === '9');
    const held: Admission[] = [];
    for (let i = 0; i < 10; i++) held.push(await take(b));
    const ok = held.filter((r) => r.ok).length;
    t.equal(ok, 9, 'B admits 9 of 10: the limit A learned');
    t.equal(b.state(1).effectiveLimit, 9, "B's effective limit shows it");
    for (const r of held) if (r.ok) r.permit.release({ status: 200, latencyMs: 20 });
  });
});
