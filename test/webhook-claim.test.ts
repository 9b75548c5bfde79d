// The deliverer's one statement (src/webhooks/claim.ts), on both stores: it writes the outcomes gathered since
// the last one and claims the next due rows in the same round trip (issue 28 §5: one statement per batch
// instead of a claim and a record), with the delivery rules of the spec intact — a row is recorded once and
// not sent again by the statement that records it, and the failure that deactivates a destination is reported
// even when nothing is claimed, and a batch is never refused for a failure reason it cannot store.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { startTestApi } from './helpers/service.js';
import { needServer } from './helpers/servers.js';
import { claimAndRecord, type Claim } from '../src/webhooks/claim.js';
import { FAILURES_BEFORE_DEACTIVATION } from '../src/webhooks/deliverer.js';
import type { Outcome } from '../src/webhooks/outcomes.js';
import type { Engine } from './helpers/service.js';

const engines: Engine[] = ['pglite'];
if (!(await needServer('postgres'))) engines.push('postgres');

const claim = (n: number): Claim => ({ n, leaseMs: 30_000, dests: [], rooms: [], initialRoom: 8 });

for (const engine of engines) {
  t.test(engine, async (t) => {
    const api = await startTestApi({ engine });
    t.teardown(() => api.close());
    const { sql } = api;
    const boot = await api.bootstrap({ plan: 'team' });

    async function dest(failures = 0): Promise<number> {
      const { rows } = await sql.query<{ id: number }>(
        `INSERT INTO webhook_endpoints (team_id, name, url, signing_secret_enc, consecutive_failures)
         VALUES ($1, $2, 'https://hooks.example.test/in', 'sealed', $3) RETURNING id`,
        [boot.team.id, `h-${randomBytes(3).toString('hex')}`, failures],
      );
      return rows[0]!.id;
    }
    /** Due rows for `dest`, oldest first. */
    async function due(dest: number, n: number): Promise<string[]> {
      const ids: string[] = [];
      for (let i = 0; i < n; i++) {
        const { rows } = await sql.query<{ id: string }>(
          `INSERT INTO webhook_deliveries (webhook_endpoint_id, job_id, event_type, body, body_sha256, next_attempt_at)
           VALUES ($1, $2, 'async.job.completed', $3, 'sha', now() - interval '1 minute' + $4 * interval '1 second') RETURNING id`,
          [dest, `job_${randomBytes(8).toString('hex')}`, Buffer.from('{}'), i],
        );
        ids.push(String(rows[0]!.id));
      }
      return ids;
    }
    const outcome = (row: { id: string; webhook_endpoint_id: number; job_id: string; attempts: number }, ok: boolean): Outcome => ({
      rowId: row.id, dest: row.webhook_endpoint_id, jobId: row.job_id, poolId: null, ok, status: ok ? 200 : 500,
      error: ok ? null : 'HTTP 500', attempt: row.attempts, latencyMs: 3, retryMs: null,
    });
    const rowState = async (id: string) =>
      (await sql.query<{ status: string; attempts: number }>('SELECT status, attempts FROM webhook_deliveries WHERE id = $1', [id])).rows[0]!;
    const attemptsOf = async (d: number) =>
      (await sql.query<{ result: string; attempt: number }>('SELECT result, attempt FROM webhook_delivery_attempts WHERE webhook_endpoint_id = $1 ORDER BY id', [d])).rows;
    const record = (outcomes: Outcome[]) => ({ outcomes, failuresBeforeDeactivation: FAILURES_BEFORE_DEACTIVATION });

    t.test('one statement records the finished delivery and claims the next due row', async (t) => {
      const d = await dest();
      const [a, b] = await due(d, 2);
      const first = await claimAndRecord(sql, claim(1), null);
      t.same(first.rows.map((r) => r.id), [a], 'the oldest due row, one attempt counted');
      t.equal(first.rows[0]!.attempts, 1);
      const next = await claimAndRecord(sql, claim(10), record([outcome(first.rows[0]!, true)]));
      t.same(next.rows.map((r) => r.id), [b], 'the next row claimed in the statement that records the first');
      t.same(next.deactivated, []);
      t.same(await rowState(a!), { status: 'delivered', attempts: 1 }, 'the first is delivered');
      t.same(await attemptsOf(d), [{ result: 'success', attempt: 1 }], 'and in the history once');
    });

    t.test('a row whose lease ran out before its outcome came back is recorded, not claimed again by that statement', async (t) => {
      const d = await dest();
      const [a] = await due(d, 1);
      const first = await claimAndRecord(sql, claim(1), null);
      t.same(first.rows.map((r) => r.id), [a]);
      // The lease lapses (the process stalled): the row is due again while its outcome waits to be written.
      await sql.query(`UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 second' WHERE id = $1`, [a]);
      const next = await claimAndRecord(sql, claim(10), record([outcome(first.rows[0]!, true)]));
      t.same(next.rows.map((r) => r.id), [], 'not claimed (a statement must not update one row twice; the write wins)');
      t.same(await rowState(a!), { status: 'delivered', attempts: 1 }, 'delivered, as its outcome says');
    });

    t.test('the failure that deactivates a destination is reported though nothing is claimed', async (t) => {
      const d = await dest(FAILURES_BEFORE_DEACTIVATION - 1);
      await due(d, 1);
      const first = await claimAndRecord(sql, claim(1), null);
      const next = await claimAndRecord(sql, { ...claim(10), dests: [d], rooms: [0] }, record([outcome(first.rows[0]!, false)]));
      t.same(next.rows, [], 'no room for the failing destination: nothing claimed');
      t.same(next.deactivated, [d], 'its 8th consecutive failure deactivated it');
      const { rows } = await sql.query<{ disabled: boolean; consecutive_failures: number }>('SELECT disabled, consecutive_failures FROM webhook_endpoints WHERE id = $1', [d]);
      t.same(rows[0], { disabled: true, consecutive_failures: FAILURES_BEFORE_DEACTIVATION });
      t.same(await attemptsOf(d), [{ result: 'failure', attempt: 1 }]);
    });

    t.test('a failure reason cut inside a surrogate pair, or with a NUL, is written (the batch is not refused)', async (t) => {
      const d = await dest();
      await due(d, 1);
      const first = await claimAndRecord(sql, claim(1), null);
      const failed = { ...outcome(first.rows[0]!, false), error: 'ECONNRESET: \u0000 reset 😀'.slice(0, -1) };
      await claimAndRecord(sql, claim(10), record([failed]));
      const { rows } = await sql.query<{ error: string }>('SELECT error FROM webhook_delivery_attempts WHERE webhook_endpoint_id = $1', [d]);
      t.same(rows, [{ error: 'ECONNRESET: \uFFFD reset \uFFFD' }], 'each unstorable character is U+FFFD');
    });
  });
}
