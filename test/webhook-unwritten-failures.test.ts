// Spec, webhooks: 8 consecutive failed deliveries deactivate a destination; the deliverer claims nothing more for
// a destination while one of its failures is not yet in the store, so its 8th failure deactivates it before
// anything more is claimed (docs/jobs-and-webhooks.md, "A failure streak and what is still in flight").
//
// The order that once let a 9th attempt through (CI, webhook-state.test.ts "bug 2" counted 12 attempts where 11
// at most may be): a claim with nothing to write is in flight when the 8th failure comes back; the recorder
// starts writing it; the claim ends and took the failure for one it had written itself, so the next claim gave
// the destination room before the failure was in the store. Here that order is made, not hoped for: the
// store's statements pass through a gate that holds claims and writes where the test says, and the 8th send
// fails when the test moves the deliverer's send clock past the timeout.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { startTestApi, type Engine } from './helpers/service.js';
import { startReceiver } from './helpers/receiver.js';
import { needServer } from './helpers/servers.js';
import { DrivenGovernorTime } from './helpers/test-clock.js';
import { until } from './helpers/until.js';
import { enqueueJobEvent } from '../src/webhooks/outbox.js';
import { Deliverer, DELIVERY_TIMEOUT_MS, FAILURES_BEFORE_DEACTIVATION } from '../src/webhooks/deliverer.js';
import { createLogger } from '../src/log.js';
import type { Sql, SqlParam } from '../src/store/sql.js';
import type { JobEvent } from '../src/jobs/job-event.js';

const hex = (n: number) => randomBytes(n).toString('hex');

/** Holds the deliverer's statements of one kind until released: a claim with nothing to write, or a write. */
class StatementGate {
  readonly sql: Sql;
  #holdClaims = false;
  #holdWrites = false;
  readonly held = { claims: [] as Array<() => void>, writes: [] as Array<() => void> };
  /** Claims (with nothing to write) begun and ended; writes ended. */
  claimsBegun = 0;
  claimsEnded = 0;
  writesEnded = 0;
  /** For each ended claim, how many writes had ended when it began. */
  readonly claimsAfterWrites: number[] = [];

  constructor(inner: Sql) {
    const query = async (text: string, params?: readonly SqlParam[]) => {
      // claim.ts: a claim alone starts with its `room` expression; a statement that writes, with the outcomes `o`.
      const claim = text.startsWith('WITH room AS');
      const write = text.startsWith('WITH o AS');
      const writesBefore = this.writesEnded;
      if (claim) this.claimsBegun++;
      if (claim && this.#holdClaims) await new Promise<void>((r) => this.held.claims.push(r));
      if (write && this.#holdWrites) await new Promise<void>((r) => this.held.writes.push(r));
      try {
        return await inner.query(text, params);
      } finally {
        if (claim) {
          this.claimsEnded++;
          this.claimsAfterWrites.push(writesBefore);
        }
        if (write) this.writesEnded++;
      }
    };
    this.sql = new Proxy(inner, {
      get: (target, prop) => {
        if (prop === 'query') return query;
        const v = Reflect.get(target, prop, target);
        return typeof v === 'function' ? v.bind(target) : v;
      },
    });
  }

  holdClaims(on: boolean): void {
    this.#holdClaims = on;
    if (!on) for (const r of this.held.claims.splice(0)) r();
  }

  holdWrites(on: boolean): void {
    this.#holdWrites = on;
    if (!on) for (const r of this.held.writes.splice(0)) r();
  }
}

const engines: Engine[] = ['pglite'];
if (!(await needServer('postgres'))) engines.push('postgres');

const receiver = await startReceiver();
t.teardown(() => receiver.close());

for (const engine of engines) {
  t.test(`${engine}: a failure that comes back while a claim runs stops the destination's claims until it is written`, async (t) => {
    // The Control API alone (no worker role): the one deliverer is the test's own.
    const svc = await startTestApi({ engine, overrides: { webhookCaFile: receiver.caFile } });
    t.teardown(() => svc.close());
    const boot = await svc.bootstrap({ plan: 'team' });
    const sql = svc.sql;
    const sub = `p-${hex(4)}`;
    const { rows } = await sql.query<{ id: number }>(
      `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, async_enabled)
       VALUES ($1, $2, $2, 'http', 'https://api.example.test', 'api.example.test', true) RETURNING id`,
      [boot.team.id, sub],
    );
    const pool = { id: rows[0]!.id, host: `${sub}.${svc.config.poolDomain}` };
    const path = `/streak-${hex(3)}`;
    // Seven failures answered at once; the 8th send hangs until the test passes its timeout.
    receiver.queue(path, ...Array.from({ length: FAILURES_BEFORE_DEACTIVATION - 1 }, () => ({ status: 500 })));
    receiver.on(path, 'hang');
    const hook = await svc.api('POST', '/api/v1/webhooks', { token: boot.token, body: { name: `h-${hex(3)}`, url: `${receiver.url}${path}`, pool_ids: [pool.id] } });
    t.equal(hook.status, 201, 'the destination created');
    const id: number = hook.body.data.id;
    const event = (): JobEvent => ({
      jobId: `job_${hex(8)}`, poolId: pool.id, poolHost: pool.host, status: 'completed', reason: 'requested',
      createdAt: Date.now(), completedAt: Date.now(), detail: { kind: 'http', status: 200, headers: {}, body: 'x' },
    });
    const claimed = async () =>
      (await sql.query<{ n: number }>('SELECT COALESCE(sum(attempts), 0)::int AS n FROM webhook_deliveries WHERE webhook_endpoint_id = $1', [id])).rows[0]!.n;
    const recorded = async () =>
      (await sql.query<{ n: number }>('SELECT count(*)::int AS n FROM webhook_delivery_attempts WHERE webhook_endpoint_id = $1', [id])).rows[0]!.n;

    const gate = new StatementGate(sql);
    const sendTime = new DrivenGovernorTime();
    // One delivery in flight to the destination at a time (so none may follow the 8th failure); one attempt per
    // delivery; the claim lease (real time) an hour, so a held send is never claimed again.
    const deliverer = new Deliverer({
      sql: gate.sql,
      box: svc.box,
      log: createLogger('silent'),
      targets: { allowPrivate: true, ownHosts: [], lookup: async () => ['127.0.0.1'] },
      caFile: receiver.caFile,
      retry: { baseMs: 3_600_000, capMs: 3_600_000, maxAttempts: 1 },
      leaseMs: 3_600_000,
      concurrency: 4,
      perDestination: 1,
      pollMs: 10,
      time: sendTime,
    });
    // More events than the streak needs: rows are due for the destination all along.
    await sql.transaction(async (tx) => {
      for (let i = 0; i < 2 * FAILURES_BEFORE_DEACTIVATION; i++) await enqueueJobEvent(tx, event());
    });
    await deliverer.start();
    // Stopping waits for the sends in flight: a hanging one ends when its (driven) timeout passes.
    let stopped: Promise<void> | null = null;
    const stop = async () => {
      gate.holdClaims(false);
      gate.holdWrites(false);
      stopped ??= deliverer.stop();
      let done = false;
      void stopped.then(() => (done = true));
      await until('the deliverer stopped', () => {
        sendTime.advance(DELIVERY_TIMEOUT_MS);
        return done;
      });
    };
    t.teardown(stop);

    // Seven failures in the store, the 8th send on its way.
    await until('7 failures recorded', async () => (await recorded()) === FAILURES_BEFORE_DEACTIVATION - 1);
    await receiver.waitFor(path, FAILURES_BEFORE_DEACTIVATION);
    // A claim with nothing to write is in flight (the poll makes one while rows are due)…
    gate.holdClaims(true);
    await until('a claim held', () => gate.held.claims.length > 0);
    // …when the 8th failure comes back, and the write that records it starts.
    gate.holdWrites(true);
    sendTime.advance(DELIVERY_TIMEOUT_MS);
    await until('the 8th failure being written', () => gate.held.writes.length > 0);
    // The claim ends; the next one (the poll's) runs while the 8th failure is still unwritten.
    const begun = gate.claimsBegun;
    gate.holdClaims(false);
    await until('a later claim ended', () => gate.claimsEnded > begun);
    t.equal(await claimed(), FAILURES_BEFORE_DEACTIVATION, 'nothing claimed for the destination while its 8th failure is unwritten');

    const writes = gate.writesEnded;
    gate.holdWrites(false);
    await until('deactivated', async () => (await sql.query<{ disabled: boolean }>('SELECT disabled FROM webhook_endpoints WHERE id = $1', [id])).rows[0]!.disabled);
    // A claim that began after the 8th failure was written has ended: it could not take the destination's rows.
    await until('a claim after the deactivation', () => gate.claimsAfterWrites.some((w) => w > writes));
    t.equal(await claimed(), FAILURES_BEFORE_DEACTIVATION, 'nothing claimed after the 8th failure');
    t.equal(await recorded(), FAILURES_BEFORE_DEACTIVATION, 'the 8 attempts recorded');
    await stop();
    t.equal(receiver.received.filter((r) => r.path === path).length, FAILURES_BEFORE_DEACTIVATION, 'the receiver saw 8 attempts');
  });
}
