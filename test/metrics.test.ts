// Pool metrics: the rollup batch writer and pruning (both store engines), and the metrics summary endpoint.
import t, { type Test } from 'tap';
import { randomBytes } from 'node:crypto';
import { startTestApi, type TestApi } from './helpers/service.js';
import { needServer } from './helpers/servers.js';
import { addMinuteRollups, pruneRollups, sumRollups, type MinuteRollup } from '../src/store/metrics.js';
import type { Queryable } from '../src/store/sql.js';

const MIN = 60_000;
const HOUR = 60 * MIN;
const DAY = 24 * HOUR;
const RETENTION_DAYS = 7;

async function makePool(sql: Queryable, teamId: number): Promise<{ id: number; subdomain: string }> {
  const subdomain = `m-${randomBytes(4).toString('hex')}`;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host)
     VALUES ($1, $2, $2, 'http', 'https://api.example.test', 'api.example.test') RETURNING id`,
    [teamId, subdomain],
  );
  return { id: rows[0]!.id, subdomain };
}

const rollup = (poolId: number, minute: Date, requests: number, admitted: number, queued: number, rejected: number): MinuteRollup =>
  ({ poolId, minute, requests, admitted, queued, rejected });

async function storedRows(sql: Queryable, poolId: number) {
  const { rows } = await sql.query<{ minute: Date; requests: string; admitted: string; queued: string; rejected: string }>(
    'SELECT minute, requests::text, admitted::text, queued::text, rejected::text FROM pool_metrics_minute WHERE pool_id = $1 ORDER BY minute',
    [poolId],
  );
  return rows.map((r) => ({ minute: r.minute.toISOString(), counts: [r.requests, r.admitted, r.queued, r.rejected].map(Number) }));
}

/** The rollup store against one engine: batching, accumulation, truncation, skipping, pruning. */
async function storeSuite(t: Test, svc: TestApi): Promise<void> {
  const sql = svc.sql;
  const boot = await svc.bootstrap();
  const a = await makePool(sql, boot.team.id);
  const b = await makePool(sql, boot.team.id);
  const m0 = new Date(Math.floor(Date.now() / MIN) * MIN - 10 * MIN);
  const m1 = new Date(m0.getTime() + MIN);

  await t.test('one batch upserts many rows, summing increments of the same pool and minute', async (t) => {
    await addMinuteRollups(sql, [
      rollup(a.id, m0, 10, 8, 2, 2),
      rollup(a.id, new Date(m0.getTime() + 59_999), 5, 5, 1, 0), // same minute, truncated
      rollup(a.id, m1, 3, 3, 0, 0),
      rollup(b.id, m0, 7, 1, 1, 6),
      rollup(2147483000, m0, 1, 1, 0, 0), // no such pool: skipped, not a failed batch
    ]);
    t.same(await storedRows(sql, a.id), [
      { minute: m0.toISOString(), counts: [15, 13, 3, 2] },
      { minute: m1.toISOString(), counts: [3, 3, 0, 0] },
    ]);
    t.same(await storedRows(sql, b.id), [{ minute: m0.toISOString(), counts: [7, 1, 1, 6] }]);

    await addMinuteRollups(sql, [rollup(a.id, m0, 1, 0, 1, 1), rollup(b.id, m1, 2, 2, 0, 0)]);
    t.same(await storedRows(sql, a.id), [
      { minute: m0.toISOString(), counts: [16, 13, 4, 3] },
      { minute: m1.toISOString(), counts: [3, 3, 0, 0] },
    ], 'a later batch adds to the stored counts');
    t.same(await storedRows(sql, b.id), [
      { minute: m0.toISOString(), counts: [7, 1, 1, 6] },
      { minute: m1.toISOString(), counts: [2, 2, 0, 0] },
    ]);
    await addMinuteRollups(sql, []);
  });

  await t.test('invalid increments are refused before anything is written', async (t) => {
    const before = await storedRows(sql, a.id);
    for (const bad of [rollup(a.id, m0, -1, 0, 0, 0), rollup(a.id, m0, 1.5, 0, 0, 0), rollup(a.id, new Date(NaN), 1, 1, 0, 0)]) {
      await t.rejects(addMinuteRollups(sql, [rollup(a.id, m1, 1, 1, 0, 0), bad]), TypeError);
    }
    t.same(await storedRows(sql, a.id), before);
  });

  await t.test('sums beyond 32 bits come back as exact numbers', async (t) => {
    const c = await makePool(sql, boot.team.id);
    await addMinuteRollups(sql, [rollup(c.id, m0, 3_000_000_000, 2_999_999_999, 5, 0), rollup(c.id, m1, 3_000_000_000, 1, 0, 0)]);
    t.same(await sumRollups(sql, c.id, null, null), { requests: 6_000_000_000, admitted: 3_000_000_000, queued: 5, rejected: 0 });
  });

  await t.test('pruneRollups deletes the minutes before the cutoff, of every pool', async (t) => {
    t.equal(await pruneRollups(sql, m1), 3, 'the m0 rows of the three pools above');
    t.same((await storedRows(sql, a.id)).map((r) => r.minute), [m1.toISOString()]);
    t.same((await storedRows(sql, b.id)).map((r) => r.minute), [m1.toISOString()]);
    t.equal(await pruneRollups(sql, m1), 0);
  });
}

t.test('rollup store on PGlite', async (t) => {
  const svc = await startTestApi();
  t.teardown(() => svc.close());
  await storeSuite(t, svc);
});

t.test('rollup store on PostgreSQL', async (t) => {
  const skip = await needServer('postgres');
  if (skip) return t.skip(skip);
  const svc = await startTestApi({ engine: 'postgres' });
  t.teardown(() => svc.close());
  await storeSuite(t, svc);
});

t.test('GET /api/v1/pools/:pool/metrics', async (t) => {
  const svc = await startTestApi({ overrides: { metricsRetentionDays: RETENTION_DAYS } });
  t.teardown(() => svc.close());
  const sql = svc.sql;
  const boot = await svc.bootstrap();
  const other = await svc.bootstrap();
  const pool = await makePool(sql, boot.team.id);
  const neighbour = await makePool(sql, boot.team.id);
  const metrics = (query = '', token: string = boot.token, subdomain = pool.subdomain) =>
    svc.api('GET', `/api/v1/pools/${subdomain}/metrics${query}`, { token });

  const now = Math.floor(Date.now() / MIN) * MIN;
  const at = (ms: number) => new Date(now - ms);
  // Three recent hours of traffic, plus an old minute past retention that pruning has not removed yet.
  await addMinuteRollups(sql, [
    rollup(pool.id, at(3 * HOUR), 10, 10, 0, 0),
    rollup(pool.id, at(2 * HOUR), 20, 15, 4, 5),
    rollup(pool.id, at(1 * HOUR), 10, 5, 4, 5),
    rollup(pool.id, at((RETENTION_DAYS + 2) * DAY), 1000, 0, 1000, 1000),
    rollup(neighbour.id, at(2 * HOUR), 500, 500, 500, 0),
  ]);

  await t.test('sums and ratios over everything within retention, unwrapped', async (t) => {
    const res = await metrics();
    t.equal(res.status, 200);
    t.same(res.body, {
      pool_id: pool.id,
      requests: 40,
      admitted: 30,
      admit_rate: 0.75,
      queued_count: 8,
      queued_pct: 20,
      range: { from: null, to: null, retention_days: RETENTION_DAYS, clamped: false },
    });
  });

  await t.test('a pool with no traffic reports zeros, not NaN', async (t) => {
    const quiet = await makePool(sql, boot.team.id);
    const res = await metrics('', boot.token, quiet.subdomain);
    t.equal(res.status, 200);
    t.match(res.body, { pool_id: quiet.id, requests: 0, admitted: 0, admit_rate: 0, queued_count: 0, queued_pct: 0 });
  });

  await t.test('from is inclusive and to exclusive, on minute starts', async (t) => {
    const from = at(2 * HOUR).toISOString();
    const to = at(1 * HOUR).toISOString();
    const res = await metrics(`?from=${from}&to=${to}`);
    t.equal(res.status, 200);
    t.match(res.body, { requests: 20, admitted: 15, admit_rate: 0.75, queued_count: 4, queued_pct: 20 });
    t.same(res.body.range, { from, to, retention_days: RETENTION_DAYS, clamped: false });

    const onlyFrom = await metrics(`?from=${encodeURIComponent(at(2 * HOUR + 1).toISOString())}`);
    t.match(onlyFrom.body, { requests: 30, admitted: 20, queued_count: 8 });
    t.equal(onlyFrom.body.range.to, null);

    const onlyTo = await metrics(`?to=${to}`);
    t.match(onlyTo.body, { requests: 30, admitted: 25, queued_count: 4 }, 'an open from still stops at retention');
    t.same(onlyTo.body.range, { from: null, to, retention_days: RETENTION_DAYS, clamped: false });

    const empty = await metrics(`?from=${from}&to=${from}`);
    t.equal(empty.status, 200, 'from equal to to is an empty range');
    t.match(empty.body, { requests: 0, admit_rate: 0, queued_pct: 0 });

    const offset = new Date(at(2 * HOUR).getTime() + 2 * HOUR).toISOString().slice(0, 19) + '+02:00';
    const withOffset = await metrics(`?from=${encodeURIComponent(offset)}`);
    t.equal(withOffset.body.range.from, from, 'an offset is the same instant, reported in UTC');
  });

  await t.test('a range reaching past retention is clamped to it', async (t) => {
    const before = Date.now();
    const res = await metrics(`?from=${at(30 * DAY).toISOString()}`);
    t.equal(res.status, 200);
    t.match(res.body, { requests: 40, admitted: 30, queued_count: 8 }, 'the minute past retention is not counted');
    t.equal(res.body.range.clamped, true);
    const from = Date.parse(res.body.range.from);
    t.ok(from >= before - RETENTION_DAYS * DAY && from <= Date.now() - RETENTION_DAYS * DAY, 'from moved up to the retention start');
    t.equal(res.body.range.to, null);

    const allOld = await metrics(`?from=${at(30 * DAY).toISOString()}&to=${at(20 * DAY).toISOString()}`);
    t.equal(allOld.status, 200);
    t.match(allOld.body, { requests: 0, range: { clamped: true } });
    t.equal(allOld.body.range.from, allOld.body.range.to, 'both bounds clamped: an empty range at the retention start');

    const inside = await metrics(`?from=${at(RETENTION_DAYS * DAY - HOUR).toISOString()}`);
    t.equal(inside.body.range.clamped, false, 'a range inside retention is not clamped');
  });

  await t.test('bad dates, from after to and unknown query parameters are 422', async (t) => {
    const cases = [
      '?from=yesterday',
      '?to=2026-13-01T00:00:00Z',
      '?from=2026-01-01T00:00:00',
      '?from=2026-01-01',
      '?from=2026-06-30T23:59:60Z',
      '?from=2026-01-01T00:00:00%2B02',
      `?from=${at(HOUR).toISOString()}&to=${at(2 * HOUR).toISOString()}`,
      '?form=2026-01-01T00:00:00Z',
    ];
    for (const q of cases) {
      const res = await metrics(q);
      t.equal(res.status, 422, q);
      t.type(res.body?.message, 'string', q);
    }
  });

  await t.test('metrics:read is required; unknown pools and other teams\' pools are 404', async (t) => {
    const limited = await svc.admin(['token', 'create', '--team', boot.team.slug, '--user', String(boot.user.id), '--abilities', 'pools:read']);
    const denied = await metrics('', limited.token);
    t.equal(denied.status, 403);
    t.match(denied.body.message, /metrics:read/);
    t.equal((await metrics('?from=yesterday', limited.token)).status, 403, 'the ability is checked before the query');
    const foreign = await metrics('', other.token);
    t.equal(foreign.status, 404);
    t.same(foreign.body, { message: 'pool not found' });
    t.equal((await metrics('', boot.token, 'no-such-pool')).status, 404);
  });

  await t.test('the OpenAPI document describes the endpoint with PoolMetricsSummary', async (t) => {
    const res = await svc.api('GET', '/api/v1/openapi.json');
    const op = res.body.paths['/api/v1/pools/{pool}/metrics']?.get;
    t.ok(op, 'documented');
    t.same(op.parameters.filter((p: { in: string }) => p.in === 'query').map((p: { name: string }) => p.name).sort(), ['from', 'to']);
    t.ok(res.body.components.schemas.PoolMetricsSummary);
  });
});
