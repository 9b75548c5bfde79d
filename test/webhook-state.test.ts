// Two state bugs of issue 18, on both stores (PGlite and PostgreSQL):
// 1. Re-enable (`poolgate admin webhook enable`) reaches the data plane at once: an async request to a pool
//    whose only destination was deactivated gets 202 promptly after the enable, not after the 30 s resync;
//    and the deactivation itself makes the pool synchronous promptly (same change notification).
// 2. The 8th consecutive failed delivery deactivates the destination, with no attempts beyond those
//    already in flight (counted at the receiver), however many events are queued for it.
// And replay and recover (Svix's resend and recover; beyond the spec): Control API and admin commands.
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
import { verifyDelivery } from '../src/index.js';
import type { JobEvent } from '../src/jobs/job-event.js';
import { until } from './helpers/until.js';
import { DrivenGovernorTime } from './helpers/test-clock.js';

const hex = (n: number) => randomBytes(n).toString('hex');


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
      // Retries come back within tens of ms, so the streak builds quickly; the resync is an hour away, so
      // only the change feed can carry a change to the data plane during the test (no wall-clock bound needed).
      // Two attempts per delivery, so a delivery is given up quickly (recover).
      overrides: { webhookCaFile: receiver.caFile, originCaFile: origin.caFile, webhookRetryBaseMs: 20, webhookRetryCapMs: 40, webhookMaxAttempts: 2, snapshotResyncMs: 3_600_000 },
      // The send timeout on a clock the test never moves: no test here is about it, and a loaded machine that
      // takes 5 s over a loopback POST must not turn an expected success into a failure.
      webhookTime: new DrivenGovernorTime(),
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
    /** Attempts claimed for the destination (a claim counts one at once) and attempts recorded with their outcome. */
    const attempts = async (id: number) =>
      (await sql.query<{ claimed: number; recorded: number }>(
        `SELECT (SELECT COALESCE(sum(attempts), 0)::int FROM webhook_deliveries WHERE webhook_endpoint_id = $1) AS claimed,
                (SELECT count(*)::int FROM webhook_delivery_attempts WHERE webhook_endpoint_id = $1) AS recorded`,
        [id],
      )).rows[0]!;
    /**
     * The positive signal for "nothing was claimed for `id`" (issue 28): once every pending row of `id` is due,
     * a delivery to a fresh destination on the same pool is claimed and sent. The claim takes the oldest due
     * rows of every active destination first, so a claim that reached this later row would have taken `id`'s.
     */
    async function witnessClaim(p: { id: number; host: string }, id: number): Promise<void> {
      await until('every pending row of the destination due', async () =>
        (await sql.query<{ due: boolean }>(
          `SELECT bool_and(next_attempt_at <= now()) AS due FROM webhook_deliveries WHERE webhook_endpoint_id = $1 AND status = 'pending'`,
          [id],
        )).rows[0]?.due !== false);
      const path = `/witness-${hex(3)}`;
      await hook(path, [p.id]);
      await sql.transaction((tx) => enqueueJobEvent(tx, event(p)));
      await receiver.waitFor(path, 1);
    }

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
      await until('the pool is async', async () => (await asyncCall()) === 202);

      // The destination fails 8 times (the deliverer deactivates it): the pool serves synchronously.
      receiver.on(path, { status: 500 });
      await sql.transaction(async (tx) => {
        for (let i = 0; i < 8; i++) await enqueueJobEvent(tx, event(p));
      });
      await until('deactivation', async () => (await state(id)).disabled);
      const deactivatedAt = Date.now();
      await until('the data plane serves synchronously', async () => (await asyncCall()) === 200);
      t.pass(`deactivation reached the data plane through the change feed, in ${Date.now() - deactivatedAt} ms (the resync is an hour away)`);

      receiver.on(path, 'ok');
      const out = await svc.admin(['webhook', 'enable', '--team', boot.team.slug, '--id', String(id)]);
      t.equal(out.webhook.disabled, false);
      const enabledAt = Date.now();
      await until('202 after Re-enable', async () => (await asyncCall()) === 202);
      t.pass(`re-enable reached the data plane through the change feed, in ${Date.now() - enabledAt} ms (the resync is an hour away)`);
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
      // The attempts in flight at the 8th failure come back and are recorded: every claimed attempt has its outcome.
      await until('every claimed attempt recorded', async () => {
        const a = await attempts(id);
        return a.claimed === a.recorded;
      });
      const sent = at();
      const s = await state(id);
      const { rows } = await sql.query<{ error: string }>('SELECT error FROM webhook_delivery_attempts WHERE webhook_endpoint_id = $1', [id]);
      const recorded = rows.length;
      // An attempt that failed before its request was complete (a connection error on a very busy host) is a
      // recorded failure the receiver never saw: every attempt the receiver saw is recorded, and every recorded one counts.
      t.ok(sent <= recorded, `every attempt that reached the receiver (${sent}) is recorded (${recorded}: ${[...new Set(rows.map((r) => r.error))].join(', ')})`);
      t.equal(s.consecutive_failures, recorded, 'the streak counts every attempt');
      // Only attempts already on their way when the 8th failure came back may follow it. A claim gives the
      // destination room only once every failure back is written (7 at most: the 8th deactivates), and in flight
      // plus room stay within its limit, halved from 8 to 4 by the first failure: 7 + 4 at most
      // (docs/jobs-and-webhooks.md; the order that once exceeded it: webhook-unwritten-failures.test.ts).
      t.ok(recorded >= FAILURES_BEFORE_DEACTIVATION && recorded <= FAILURES_BEFORE_DEACTIVATION + 3, `${recorded} attempts (8 + those in flight)`);
      await witnessClaim(p, id);
      t.same(await attempts(id), { claimed: recorded, recorded }, 'nothing more is claimed for the deactivated destination');
      t.equal(at(), sent, 'nothing is sent to the deactivated destination');
    });

    t.test('replay: one delivery sent again with its job id and body, signed with the current secret', async (t) => {
      const p = await pool();
      const path = `/replay-${hex(3)}`;
      const id = await hook(path, [p.id]);
      const e = event(p);
      await sql.transaction((tx) => enqueueJobEvent(tx, e));
      const [first] = await receiver.waitFor(path, 1);
      await until('recorded', async () => (await sql.query<{ status: string }>('SELECT status FROM webhook_deliveries WHERE job_id = $1', [e.jobId])).rows[0]?.status === 'delivered');
      const rotated = await svc.api('POST', `/api/v1/webhooks/${id}/rotate`, { token: boot.token });
      const secret = rotated.body.data.signing_secret as string;

      const res = await svc.api('POST', `/api/v1/webhooks/${id}/deliveries/${e.jobId}/replay`, { token: boot.token });
      t.equal(res.status, 202);
      t.same(res.body.data, [{ webhook_endpoint_id: id, job_id: e.jobId, event_type: 'async.job.completed', previous_status: 'delivered', attempts: 1 }]);
      const got = await receiver.waitFor(path, 2);
      const again = got[1]!;
      t.equal(again.headers['x-service-job-id'], e.jobId, 'same job id: receivers de-duplicate as they already do');
      t.same(again.rawBody, first!.rawBody, 'the same bytes');
      t.match(verifyDelivery(secret, again.headers, again.rawBody), { ok: true }, 'signed with the current (rotated) secret');
      t.not(again.headers['x-service-signature'], first!.headers['x-service-signature']);
      const hist = await until('the replay recorded', async () => {
        const h = await svc.admin(['webhook', 'history', '--team', boot.team.slug, '--id', String(id)]);
        return h.attempts.length === 2 && h.attempts;
      });
      t.same(hist.map((a: any) => [a.attempt, a.result]), [[2, 'success'], [1, 'success']], 'the replay is the next attempt');

      // The admin command does the same.
      const out = await svc.admin(['webhook', 'replay', '--team', boot.team.slug, '--id', String(id), '--job', e.jobId]);
      t.match(out, { webhook_endpoint_id: id, replayed: [{ job_id: e.jobId }] });
      await receiver.waitFor(path, 3);

      // Errors are values: unknown job, another team's destination, a deactivated destination, bad ids.
      t.equal((await svc.api('POST', `/api/v1/webhooks/${id}/deliveries/job_nope/replay`, { token: boot.token })).status, 404);
      const other = await svc.bootstrap({ plan: 'team' });
      t.equal((await svc.api('POST', `/api/v1/webhooks/${id}/deliveries/${e.jobId}/replay`, { token: other.token })).status, 404, 'another organization: not found');
      t.equal((await svc.api('POST', `/api/v1/webhooks/${id}/deliveries/bad%20id/replay`, { token: boot.token })).status, 404, 'a malformed job id is not found');
      t.equal((await svc.api('POST', `/api/v1/webhooks/${id}/deliveries/${e.jobId}/replay`, { token: null })).status, 401);
      await sql.query('UPDATE webhook_endpoints SET disabled = true WHERE id = $1', [id]);
      const off = await svc.api('POST', `/api/v1/webhooks/${id}/deliveries/${e.jobId}/replay`, { token: boot.token });
      t.equal(off.status, 422);
      t.match(off.body.message, /deactivated; re-enable it first/);
      // Nothing pending, so nothing can be claimed or sent: the refused replay left the delivery as it was.
      t.same((await sql.query('SELECT status, attempts FROM webhook_deliveries WHERE job_id = $1', [e.jobId])).rows, [{ status: 'delivered', attempts: 3 }], 'the refused replay changed nothing');
      t.equal(receiver.received.filter((r) => r.path === path).length, 3, 'nothing more was sent');
    });

    t.test('recover: every delivery given up since a time is sent again', async (t) => {
      const p = await pool();
      const path = `/recover-${hex(3)}`;
      const id = await hook(path, [p.id]);
      const failedDelivery = async () => {
        const e = event(p);
        receiver.queue(path, { status: 500 }, { status: 500 });
        await sql.transaction((tx) => enqueueJobEvent(tx, e));
        await until('given up', async () => (await sql.query<{ status: string }>('SELECT status FROM webhook_deliveries WHERE job_id = $1', [e.jobId])).rows[0]?.status === 'failed');
        return e;
      };
      const older = await failedDelivery();
      // Later than the older event's enqueue by its two attempts and the retry between them.
      const since = new Date();
      const newer = await failedDelivery();
      t.equal(receiver.received.filter((r) => r.path === path).length, 4, 'two attempts each, then given up');

      const res = await svc.api('POST', `/api/v1/webhooks/${id}/recover`, { token: boot.token, body: { since: since.toISOString() } });
      t.equal(res.status, 202);
      t.same(res.body.data, { webhook_endpoint_id: id, since: since.toISOString(), recovered: 1 });
      const got = await receiver.waitFor(path, 5);
      t.equal(got[4]!.headers['x-service-job-id'], newer.jobId, 'the delivery given up after `since` is sent again');
      await until('delivered', async () => (await sql.query<{ status: string }>('SELECT status FROM webhook_deliveries WHERE job_id = $1', [newer.jobId])).rows[0]?.status === 'delivered');

      const cli = await svc.admin(['webhook', 'recover', '--team', boot.team.slug, '--id', String(id), '--since', new Date(since.getTime() - 60_000).toISOString()]);
      t.equal(cli.recovered, 1, 'the older one, through the admin command');
      const all = await receiver.waitFor(path, 6);
      t.equal(all[5]!.headers['x-service-job-id'], older.jobId);

      t.equal((await svc.api('POST', `/api/v1/webhooks/${id}/recover`, { token: boot.token, body: { since: 'yesterday' } })).status, 422);
      t.equal((await svc.api('POST', `/api/v1/webhooks/${id}/recover`, { token: boot.token, body: {} })).status, 422);
      t.equal((await svc.api('POST', `/api/v1/webhooks/999999/recover`, { token: boot.token, body: { since: since.toISOString() } })).status, 404);
      await t.rejects(svc.admin(['webhook', 'recover', '--team', boot.team.slug, '--id', String(id), '--since', 'soon']), /ISO 8601/);
    });
  });
}
