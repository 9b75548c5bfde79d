// Two state bugs of issue 18, on both stores (PGlite and PostgreSQL):
// 1. Re-enable (`poolgate admin webhook enable`) reaches the data plane at once: an async request to a pool
//    whose only destination was deactivated gets 202 promptly after the enable, not after the 30 s resync;
//    and the deactivation itself makes the pool synchronous promptly (same change notification).
// 2. The 8th consecutive failed delivery deactivates the destination, with no attempts beyond those
//    already in flight (counted at the receiver), however many events are queued for it.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { Pool } from 'undici';
import { startTestService, type Engine, type TestService } from './helpers/service.js';
import { startReceiver, type Receiver } from './helpers/receiver.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { needServer } from './helpers/servers.js';
import { enqueueJobEvent } from '../src/webhooks/outbox.js';
import { FAILURES_BEFORE_DEACTIVATION } from '../src/webhooks/deliverer.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import type { JobEvent } from '../src/jobs/job-event.js';

const hex = (n: number) => randomBytes(n).toString('hex');

async function until<T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs = 15_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const engines: Engine[] = ['pglite'];
if (!(await needServer('postgres'))) engines.push('postgres');

const receiver: Receiver = await startReceiver();
t.teardown(() => receiver.close());
const origin: Origin = await startOrigin();
t.teardown(() => origin.close());

for (const engine of engines) {
  t.test(engine, async (t) => {
    const svc: TestService = await startTestService({
      engine,
      // Retries come back within tens of ms, so the streak builds quickly; the resync is far away (30 s).
      overrides: { webhookCaFile: receiver.caFile, originCaFile: origin.caFile, webhookRetryBaseMs: 20, webhookRetryCapMs: 40 },
    });
    t.teardown(() => svc.close());
    const boot = await svc.bootstrap({ plan: 'team' });
    const sql = svc.service.sql;

    async function pool(): Promise<{ id: number; sub: string; host: string; key: string }> {
      const sub = `s-${hex(4)}`;
      const { rows } = await sql.query<{ id: number }>(
        `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent)
         VALUES ($1, $2, $2, 'http', $3, $4, 10) RETURNING id`,
        [boot.team.id, sub, origin.url, new URL(origin.url).host],
      );
      await sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
      const k = await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token: boot.token, body: {} });
      if (k.status !== 201) throw new Error(`mint: ${k.status}`);
      return { id: rows[0]!.id, sub, host: `${sub}.${svc.config.poolDomain}`, key: k.body.data.key };
    }
    async function hook(path: string, poolIds: number[]): Promise<number> {
      const res = await svc.api('POST', '/api/v1/webhooks', { token: boot.token, body: { name: `h-${hex(3)}`, url: `${receiver.url}${path}`, pool_ids: poolIds } });
      if (res.status !== 201) throw new Error(`create webhook: ${res.status} ${JSON.stringify(res.body)}`);
      return res.body.data.id;
    }
    const state = async (id: number) =>
      (await sql.query<{ disabled: boolean; consecutive_failures: number }>('SELECT disabled, consecutive_failures FROM webhook_endpoints WHERE id = $1', [id])).rows[0]!;
    const event = (p: { id: number; host: string }): JobEvent => ({
      jobId: `job_${hex(8)}`, poolId: p.id, poolHost: p.host, status: 'completed', reason: 'requested',
      createdAt: Date.now(), completedAt: Date.now(), detail: { kind: 'http', status: 200, headers: {}, body: 'x' },
    });

    t.test('bug 1: deactivation and re-enable reach the data plane at once', async (t) => {
      const p = await pool();
      const path = `/flip-${hex(3)}`;
      const id = await hook(path, [p.id]);
      const proxy = new Pool(svc.proxyUrl!, { connections: 2 });
      t.teardown(() => proxy.close());
      const asyncCall = async () => {
        const res = await proxy.request({ path: '/x', method: 'GET', headers: { host: p.host, 'x-service-key': p.key, 'x-service-async': 'true' } });
        await res.body.dump();
        return res.statusCode;
      };
      await until('the pool is async', async () => (await asyncCall()) === 202, 5000);

      // The destination fails 8 times (the deliverer deactivates it): the pool serves synchronously.
      receiver.on(path, { status: 500 });
      await sql.transaction(async (tx) => {
        for (let i = 0; i < 8; i++) await enqueueJobEvent(tx, event(p));
      });
      await until('deactivation', async () => (await state(id)).disabled);
      const deactivatedAt = Date.now();
      await until('the data plane serves synchronously', async () => (await asyncCall()) === 200, 3000);
      t.ok(Date.now() - deactivatedAt < 3000, 'deactivation reached the data plane within 3 s (the resync is 30 s)');

      receiver.on(path, 'ok');
      const out = await svc.admin(['webhook', 'enable', '--team', boot.team.slug, '--id', String(id)]);
      t.equal(out.webhook.disabled, false);
      const enabledAt = Date.now();
      await until('202 after Re-enable', async () => (await asyncCall()) === 202, 3000);
      t.ok(Date.now() - enabledAt < 3000, `re-enable reached the data plane in ${Date.now() - enabledAt} ms`);
    });

    t.test('bug 2: the 8th consecutive failure deactivates, with no attempts beyond those in flight', async (t) => {
      const p = await pool();
      const path = `/down-${hex(3)}`;
      receiver.on(path, { status: 500 });
      const id = await hook(path, [p.id]);
      const at = () => receiver.received.filter((r) => r.path === path).length;
      // Many events queued at once: the deliverer sends several to the destination in parallel.
      await sql.transaction(async (tx) => {
        for (let i = 0; i < 40; i++) await enqueueJobEvent(tx, event(p));
      });
      await until('deactivation', async () => (await state(id)).disabled);
      await new Promise((r) => setTimeout(r, 500));
      const sent = at();
      const s = await state(id);
      const { rows } = await sql.query<{ n: number }>('SELECT count(*)::int AS n FROM webhook_delivery_attempts WHERE webhook_endpoint_id = $1', [id]);
      t.equal(rows[0]!.n, sent, 'every attempt that reached the receiver is recorded');
      t.equal(s.consecutive_failures, sent, 'the streak counts every attempt');
      // Only attempts already on their way when the 8th failure came back may follow it: fewer than the
      // destination's in-flight limit, which errors keep at its floor.
      t.ok(sent >= FAILURES_BEFORE_DEACTIVATION && sent <= FAILURES_BEFORE_DEACTIVATION + 3, `${sent} attempts reached the receiver (8 + those in flight)`);
      await new Promise((r) => setTimeout(r, 300));
      t.equal(at(), sent, 'nothing is sent to the deactivated destination');
    });
  });
}
