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
import t, { type Test } from 'tap';
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
  /** Writes still to be refused (as a store that has gone away answers them). */
  #failWrites = 0;
  /** Writes to let through before the armed failures begin (failWritesAfter). */
  #failAfter = 0;
  #failArmed = 0;
  writesFailed = 0;
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
      if (write && this.#failWrites > 0) {
        this.#failWrites--;
        this.writesFailed++;
        throw new Error('connection to the store lost (test)');
      }
      try {
        return await inner.query(text, params);
      } finally {
        if (claim) {
          this.claimsEnded++;
          this.claimsAfterWrites.push(writesBefore);
        }
        if (write) {
          this.writesEnded++;
          // Armed by failWritesAfter: the failures begin once that many writes have gone through, from the
          // deliverer's own order of writes (the test's poll of the store would see it late, or not at all).
          if (this.#failArmed > 0 && --this.#failAfter === 0) {
            this.#failWrites = this.#failArmed;
            this.#failArmed = 0;
          }
        }
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

  /** The next `n` writes fail without reaching the store. */
  failWrites(n: number): void {
    this.#failWrites = n;
  }

  /** After the next `ok` writes reach the store, the `n` writes after them fail. */
  failWritesAfter(ok: number, n: number): void {
    this.#failAfter = ok;
    this.#failArmed = n;
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

/** A pool with one destination at `receiver` + `path`, the test's own deliverer (gated statements) and its stop. */
async function setup(t: Test, engine: Engine, path: string) {
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
  const hook = await svc.api('POST', '/api/v1/webhooks', { token: boot.token, body: { name: `h-${hex(3)}`, url: `${receiver.url}${path}`, pool_ids: [pool.id] } });
  t.equal(hook.status, 201, 'the destination created');
  const id: number = hook.body.data.id;
  const event = (): JobEvent => ({
    jobId: `job_${hex(8)}`, poolId: pool.id, poolHost: pool.host, status: 'completed', reason: 'requested',
    createdAt: Date.now(), completedAt: Date.now(), detail: { kind: 'http', status: 200, headers: {}, body: 'x' },
  });
  const enqueue = (n: number) =>
    sql.transaction(async (tx) => {
      for (let i = 0; i < n; i++) await enqueueJobEvent(tx, event());
    });
  const count = async (query: string) => (await sql.query<{ n: number }>(query, [id])).rows[0]!.n;
  const claimed = () => count('SELECT COALESCE(sum(attempts), 0)::int AS n FROM webhook_deliveries WHERE webhook_endpoint_id = $1');
  const recorded = () => count('SELECT count(*)::int AS n FROM webhook_delivery_attempts WHERE webhook_endpoint_id = $1');
  const disabled = async () => (await sql.query<{ disabled: boolean }>('SELECT disabled FROM webhook_endpoints WHERE id = $1', [id])).rows[0]!.disabled;

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
  return { sql, gate, sendTime, deliverer, stop, enqueue, claimed, recorded, disabled };
}

for (const engine of engines) {
  t.test(`${engine}: a failure that comes back while a claim runs stops the destination's claims until it is written`, async (t) => {
    const path = `/streak-${hex(3)}`;
    // Seven failures answered at once; the 8th send hangs until the test passes its timeout.
    receiver.queue(path, ...Array.from({ length: FAILURES_BEFORE_DEACTIVATION - 1 }, () => ({ status: 500 })));
    receiver.on(path, 'hang');
    const { gate, sendTime, deliverer, stop, enqueue, claimed, recorded, disabled } = await setup(t, engine, path);
    // More events than the streak needs: rows are due for the destination all along.
    await enqueue(2 * FAILURES_BEFORE_DEACTIVATION);
    await deliverer.start();

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
    await until('deactivated', disabled);
    // A claim that began after the 8th failure was written has ended: it could not take the destination's rows.
    await until('a claim after the deactivation', () => gate.claimsAfterWrites.some((w) => w > writes));
    t.equal(await claimed(), FAILURES_BEFORE_DEACTIVATION, 'nothing claimed after the 8th failure');
    t.equal(await recorded(), FAILURES_BEFORE_DEACTIVATION, 'the 8 attempts recorded');
    await stop();
    t.equal(receiver.received.filter((r) => r.path === path).length, FAILURES_BEFORE_DEACTIVATION, 'the receiver saw 8 attempts');
  });

  // A write of outcomes that fails (the store restarting, a connection lost) is written again, not dropped:
  // dropped, a delivered row would be sent again when its claim lapsed, and a failing destination would be
  // claimed while its failures were missing from its streak (docs/jobs-and-webhooks.md, "Batches").
  t.test(`${engine}: outcomes whose write failed are written again; nothing is sent twice`, async (t) => {
    const path = `/ok-${hex(3)}`;
    receiver.on(path, { status: 204 });
    const { gate, deliverer, enqueue, recorded, sql } = await setup(t, engine, path);
    gate.failWrites(2);
    await enqueue(3);
    await deliverer.start();
    await receiver.waitFor(path, 3);
    // The claim lease is an hour: a row whose outcome was dropped would stay claimed, undelivered, all along.
    await until('3 attempts recorded', async () => (await recorded()) === 3, 10_000);
    t.equal(gate.writesFailed, 2, 'two writes failed');
    const { rows } = await sql.query<{ status: string }>(
      `SELECT status FROM webhook_deliveries WHERE job_id IN (SELECT job_id FROM webhook_delivery_attempts) ORDER BY id`,
    );
    t.same(rows.map((r) => r.status).filter((s) => s !== 'delivered'), [], 'every delivery marked delivered');
    t.equal(receiver.received.filter((r) => r.path === path).length, 3, 'each event sent once');
  });

  t.test(`${engine}: a failing destination gets no claims while a failed write of its failures waits to be written again`, async (t) => {
    const path = `/fail-${hex(3)}`;
    receiver.on(path, { status: 500 });
    const { gate, deliverer, stop, enqueue, recorded, disabled } = await setup(t, engine, path);
    await enqueue(2 * FAILURES_BEFORE_DEACTIVATION);
    // Mid-streak: the first write of failures goes through (at most 4: the destination's in-flight limit), the next
    // three fail, so the failures they carry are missing from the streak until written again. Armed in the gate, not
    // after a poll of the store: a fast deliverer had written all 8 before the test's poll saw 3.
    gate.failWritesAfter(1, 3);
    await deliverer.start();
    await until('deactivated', disabled, 10_000);
    t.equal(gate.writesFailed, 3, 'three writes failed');
    t.equal(await recorded(), FAILURES_BEFORE_DEACTIVATION, 'the 8 attempts recorded');
    await stop();
    t.equal(receiver.received.filter((r) => r.path === path).length, FAILURES_BEFORE_DEACTIVATION, 'the receiver saw 8 attempts, none after the 8th failure');
  });
}
