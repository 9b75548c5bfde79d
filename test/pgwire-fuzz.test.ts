// Fuzzes the PostgreSQL wire listener with 10,000+ (soak run; 1,500+ in the default suite) random and mutated frames (seeded; FUZZ_SEED=<n> replays a
// run, FUZZ_ONLY=<i>,<j> single connections of it, FUZZ_DEBUG=1 shows their bytes) aimed at every phase,
// then checks the service survived with nothing leaked and nothing committed.
// FUZZ_TARGET=direct points the same harness at the local PostgreSQL itself (the harness's own proof).
import t from 'tap';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { needServer, PG_URL } from './helpers/servers.js';
import { fuzzSeed, mixScenarios, runFuzz } from './helpers/wire-fuzz.js';
import { pgProtocol, pgStream, type PgTarget } from './helpers/pg-fuzz.js';
import { checkNothingHeld, checkRun, FUZZ_CLOSE_MS, FUZZ_FRAMES, fuzzPool, settled } from './helpers/wire-fuzz-checks.js';

const direct = process.env.FUZZ_TARGET === 'direct';
const suffix = randomBytes(4).toString('hex');
const ROLE = `pgfuzz_${suffix}`;
const DB = `pgfuzz_${suffix}`;
const PASSWORD = 'fuzz-Pa55';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  const seed = fuzzSeed();
  t.comment(`fuzz seed ${seed} (replay with FUZZ_SEED=${seed})${direct ? ', target: PostgreSQL directly' : ''}`);
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  // A plain role that owns only its database: whatever the fuzz makes of its frames, it can touch nothing else.
  await admin.query(`CREATE ROLE ${ROLE} LOGIN PASSWORD '${PASSWORD}'`);
  await admin.query(`CREATE DATABASE ${DB} OWNER ${ROLE}`);
  const check = new pg.Client({ connectionString: PG_URL.replace(/\/[^/]*$/, `/${DB}`) });
  await check.connect();
  await check.query(`SET ROLE ${ROLE}`);
  await check.query('CREATE TABLE fuzz_uncommitted (id serial PRIMARY KEY, note text)');
  await check.query('CREATE TABLE fuzz_copy (line text)');
  await check.query('RESET ROLE');
  t.teardown(async () => {
    await check.end();
    await admin.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
    await admin.query(`DROP ROLE IF EXISTS ${ROLE}`);
    await admin.end();
  });

  const tables = { uncommittedTable: 'fuzz_uncommitted', copyTable: 'fuzz_copy' };
  const serverPort = Number(new URL(PG_URL).port || 5432);
  const pool = direct ? null : await fuzzPool(t, { port: serverPort, name: DB, username: ROLE, password: PASSWORD });
  const target: PgTarget & { port: number } = pool
    ? { ...tables, port: pool.svc.service.ports.pg!, user: 'fuzz', database: DB, options: `pool=${pool.sub}`, password: pool.key }
    : { ...tables, port: serverPort, user: ROLE, database: DB };
  const governor = () => pool!.dp.governor.state(pool!.poolId);
  const listener = () => pool!.svc.service.pgWire!.counts();

  t.test(`${FUZZ_FRAMES} random and mutated frames, spread over bounded connections`, async (t) => {
    const { scenario, stats } = mixScenarios(pgProtocol(target, FUZZ_CLOSE_MS));
    const report = await runFuzz({
      host: '127.0.0.1', port: target.port, seed, frames: FUZZ_FRAMES, parallel: 6, maxConnections: 2000, closeMs: FUZZ_CLOSE_MS,
      scenario, stream: pgStream(), diagnose: pool ? () => JSON.stringify({ governor: governor(), listener: listener() }) : undefined,
    });
    checkRun(t, report, stats.inserted, 'frames');

    // Sessions of the role still inside a transaction end when the server sees their client gone.
    const open = await settled(
      async () => (await check.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1 AND state IN ('idle in transaction', 'idle in transaction (aborted)', 'active')`, [ROLE])).rows[0].n as number,
      (n) => n === 0,
    );
    t.equal(open, 0, 'no upstream session is left inside a transaction');
    t.equal((await check.query('SELECT count(*)::int AS n FROM fuzz_uncommitted')).rows[0].n, 0, 'no row of a transaction the fuzz never committed was committed');
    if (!pool) return;

    await checkNothingHeld(t, governor, listener);
    t.comment(`listener counts after the fuzz: ${JSON.stringify(listener())}`);
    const c = new pg.Client({ host: '127.0.0.1', port: target.port, user: 'app', database: DB, password: pool.key, options: `pool=${pool.sub}` });
    await c.connect();
    t.equal((await c.query('SELECT 40 + 2 AS n')).rows[0].n, 42, 'a normal node-postgres client still works through the listener');
    await c.end();
  });
}
