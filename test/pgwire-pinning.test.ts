// Automatic pinning in transaction mode (issue 14): a client that creates session state keeps its server
// connection (and its slot) until the state is gone or it leaves; no other client ever sees that state, and
// the client never loses it. Each kind is interleaved with a second client on the same pool, which without
// pinning would get the first client's connection (idle connections are reused newest first). Also: the
// state removed (DISCARD ALL, UNLISTEN *, pg_advisory_unlock_all) unpins; the connection is reset before
// reuse; wireSessionState 'refuse' answers 0A000 and changes nothing; the metrics count pins by kind.
import t from 'tap';
import pg from 'pg';
import { needServer } from './helpers/servers.js';
import { assertNothingHeld, startWirePool, type WirePool } from './helpers/pgwire.js';
import { until as waitFor } from './helpers/until.js';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  const w: WirePool = await startWirePool({ maxConcurrent: 2 });
  t.teardown(() => w.close());
  const listener = () => w.svc.service.pgWire!;
  const inFlight = () => w.svc.service.dataplane!.governor.state(w.poolId).inFlight;
  /** The shared until, naming the listener's counts when a wait runs out. */
  const until = (what: string, check: () => boolean | Promise<boolean>, ms = 20_000) =>
    waitFor(() => `${what}: ${JSON.stringify(listener().counts())}, in flight ${inFlight()}`, check, ms);
  const settled = () => until('the listener to settle', () => {
    const c = listener().counts();
    return c.clients === 0 && c.linked === 0 && c.serversOpen === c.serversIdle && inFlight() === 0;
  });
  const connect = async () => {
    const c = new pg.Client(w.clientConfig());
    c.on('error', () => {});
    await c.connect();
    return c;
  };
  const metrics = async () => (await (await fetch(`${w.svc.metricsUrl}/metrics`)).text()).split('\n');
  const metric = async (name: string, reason: string) => {
    const line = (await metrics()).find((l) => l.startsWith(`${name}{`) && l.includes(`pool="${w.sub}"`) && l.includes('protocol="postgres"') && l.includes(`reason="${reason}"`));
    return line ? Number(line.split(' ').pop()) : 0;
  };

  await w.direct.query(`GRANT CREATE ON SCHEMA public TO ${w.role}`);

  interface Kind {
    reason: string;
    /** Creates the state (client a). */
    make(c: pg.Client): Promise<unknown>;
    /** Whether this session has the state. */
    has(c: pg.Client): Promise<boolean>;
    /** Removes the state, reliably enough to unpin. */
    clear: string;
  }
  const one = async (c: pg.Client, sql: string, values?: unknown[]) => Object.values((await c.query(sql, values)).rows[0] ?? {})[0];
  const kinds: Kind[] = [
    { reason: 'set', make: (c) => c.query("SET work_mem = '7MB'"), has: async (c) => (await one(c, "SELECT current_setting('work_mem')")) === '7MB', clear: 'RESET ALL' },
    {
      reason: 'set',
      make: (c) => c.query("SELECT set_config('statement_timeout', '77s', false)"),
      has: async (c) => (await one(c, "SELECT current_setting('statement_timeout')")) === '77s',
      clear: 'DISCARD ALL',
    },
    { reason: 'set', make: (c) => c.query("SET search_path = mine, public"), has: async (c) => (await one(c, "SELECT current_setting('search_path')")) === 'mine, public', clear: 'RESET ALL' },
    { reason: 'temp_table', make: (c) => c.query('CREATE TEMP TABLE tt (n int)'), has: async (c) => (await one(c, "SELECT to_regclass('pg_temp.tt') IS NOT NULL")) === true, clear: 'DISCARD TEMP' },
    { reason: 'temp_table', make: (c) => c.query('SELECT 1 AS n INTO TEMP tt2'), has: async (c) => (await one(c, "SELECT to_regclass('pg_temp.tt2') IS NOT NULL")) === true, clear: 'DISCARD ALL' },
    { reason: 'listen', make: (c) => c.query('LISTEN chan'), has: async (c) => (await one(c, "SELECT 'chan' = ANY (ARRAY(SELECT pg_listening_channels()))")) === true, clear: 'UNLISTEN *' },
    {
      reason: 'advisory_lock',
      make: (c) => c.query('SELECT pg_advisory_lock(4242)'),
      has: async (c) => (await one(c, "SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND pid = pg_backend_pid()")) === 1,
      clear: 'SELECT pg_advisory_unlock_all()',
    },
    {
      reason: 'advisory_lock',
      // A parameter through the extended protocol, as a named statement: pinned at its Bind.
      make: (c) => c.query({ name: 'lock-it', text: 'SELECT pg_try_advisory_lock($1)', values: [4343] }),
      has: async (c) => (await one(c, "SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory' AND objid = 4343 AND pid = pg_backend_pid()")) === 1,
      clear: 'SELECT pg_advisory_unlock_all()',
    },
    { reason: 'prepared_statement', make: (c) => c.query('PREPARE mine AS SELECT 1'), has: async (c) => (await one(c, "SELECT count(*)::int FROM pg_prepared_statements WHERE name = 'mine'")) === 1, clear: 'DEALLOCATE ALL' },
    {
      reason: 'cursor_with_hold',
      make: (c) => c.query('DECLARE held CURSOR WITH HOLD FOR SELECT g FROM generate_series(1, 10) g'),
      has: async (c) => (await one(c, "SELECT count(*)::int FROM pg_cursors WHERE name = 'held'")) === 1,
      clear: 'CLOSE ALL',
    },
  ];

  for (const kind of kinds) {
    t.test(`${kind.reason}: ${kind.make.toString().match(/'([^']+)'/)?.[1] ?? ''}`, async (t) => {
      await w.direct.query('CREATE SCHEMA IF NOT EXISTS mine');
      const a = await connect();
      const b = await connect();
      // Both server connections open and idle; b's transactions would get a's connection next (newest first).
      await a.query('BEGIN');
      await b.query('SELECT 1');
      await a.query('COMMIT');
      const pinsBefore = await metric('poolgate_wire_pins_total', kind.reason);
      await kind.make(a);
      t.equal(await metric('poolgate_wire_pinned_clients', kind.reason), 1, 'the pinned client shows in the gauge');
      t.equal(await metric('poolgate_wire_pins_total', kind.reason), pinsBefore + 1, 'and in the counter');
      for (let i = 0; i < 4; i++) {
        t.equal(await kind.has(b), false, `round ${i}: the other client does not see it`);
        t.equal(await kind.has(a), true, `round ${i}: the client that made it kept it`);
      }
      t.equal(inFlight(), 1, 'the pinned client holds its slot between transactions');
      // Removing the state unpins: the client holds nothing between transactions again.
      await a.query(kind.clear);
      await until('the unpin', () => inFlight() === 0);
      t.equal(await metric('poolgate_wire_pinned_clients', kind.reason), 0, 'the gauge is back to 0');
      t.equal(await kind.has(a), false, 'the state is gone');
      // Made again, then the client leaves: its connection is reset before anyone gets it.
      await kind.make(a);
      await a.end();
      const c = await connect();
      for (let i = 0; i < 2; i++) {
        t.equal(await kind.has(b), false, `after it left (${i}): the other client does not see it`);
        t.equal(await kind.has(c), false, `after it left (${i}): nor does a new client`);
      }
      t.equal(await metric('poolgate_wire_pinned_clients', kind.reason), 0, 'a client that left is no longer counted');
      await b.end();
      await c.end();
      await settled();
    });
  }

  t.test('a notification keeps reaching the client that LISTENs, between its transactions', async (t) => {
    const a = await connect();
    const b = await connect();
    await a.query('LISTEN news');
    const heard = new Promise<string | undefined>((resolve) => a.on('notification', (n) => resolve(n.payload)));
    await b.query('SELECT 1');
    await w.direct.query("NOTIFY news, 'hello'");
    t.equal(await heard, 'hello');
    await a.end();
    await b.end();
    await settled();
  });

  t.test('not pinned: SET LOCAL, SET of a tracked parameter, transaction-level advisory locks, plain statements', async (t) => {
    const a = await connect();
    for (const sql of [
      'BEGIN; SET LOCAL work_mem = \'5MB\'; COMMIT',
      "SET application_name = 'mine'",
      "SET TIME ZONE 'Asia/Tokyo'",
      'BEGIN; SELECT pg_advisory_xact_lock(1); COMMIT',
      "SELECT set_config('work_mem', '6MB', true)",
      'SELECT 1',
      '/* comment */ SELECT now()',
    ]) {
      await a.query(sql);
      t.equal(inFlight(), 0, `${sql}: nothing held between transactions`);
    }
    await a.end();
    await settled();
  });

  t.test("wireSessionState 'refuse': 0A000 naming the setting, nothing changed, the client goes on", async (t) => {
    await w.patch({ settings: { wireSessionState: 'refuse' } });
    const a = await connect();
    for (const [sql, values] of [
      ["SET work_mem = '3MB'", undefined],
      ['CREATE TEMP TABLE nope (n int)', undefined],
      ['SELECT pg_advisory_lock($1)', [5]],
      ['LISTEN nope', undefined],
    ] as Array<[string, unknown[] | undefined]>) {
      const err = await a.query(sql, values).then(() => null, (e: Error & { code?: string }) => e);
      t.equal(err?.code, '0A000', `${sql}: refused`);
      t.match(err?.message, /wireSessionState/);
      // (The link ends at the answer to poolgate's own SET of the tracked parameters, when one went ahead.)
      await until('nothing held', () => inFlight() === 0);
    }
    t.equal(await one(a, "SELECT current_setting('work_mem')"), '4MB', 'the SET did not run');
    t.equal(
      await one(a, "SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory' AND objid = 5 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"),
      0,
      'no lock taken',
    );
    // Inside a transaction: refused, and the transaction goes on.
    await a.query('BEGIN');
    const err = await a.query("SET work_mem = '3MB'").then(() => null, (e: Error & { code?: string }) => e);
    t.equal(err?.code, '0A000');
    t.equal(await one(a, 'SELECT 7'), 7, 'the transaction is still usable');
    await a.query('COMMIT');
    await a.end();
    await w.patch({ settings: { wireSessionState: null } });
    await settled();
  });

  t.test('a pinned client whose server connection is lost is ended (its state is gone)', async (t) => {
    const a = new pg.Client(w.clientConfig());
    const told = new Promise<string | undefined>((resolve) => a.on('error', (e: Error & { code?: string }) => resolve(e.code)));
    await a.connect();
    await a.query("SET work_mem = '8MB'");
    const pid = await one(a, 'SELECT pg_backend_pid()');
    await w.direct.query('SELECT pg_terminate_backend($1)', [pid]);
    t.equal(await told, '57P01', "the server's own error reaches it");
    await a.end().catch(() => {});
    await settled();
  });

  t.test('nothing is left held', (t) => assertNothingHeld(t, w, 2));
}
