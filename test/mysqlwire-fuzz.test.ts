// Fuzzes the MySQL wire listener with 10,000+ (soak run; 1,500+ in the default suite) random and mutated packets (seeded; FUZZ_SEED=<n> replays a
// run, FUZZ_ONLY=<i>,<j> single connections of it, FUZZ_DEBUG=1 shows their bytes) aimed at every phase,
// then checks the service survived with nothing leaked and nothing committed.
// FUZZ_TARGET=direct points the same harness at the local MariaDB itself (the harness's own proof).
import t from 'tap';
import { randomBytes } from 'node:crypto';
import mysql from 'mysql2/promise';
import { mysqlAccount, needServer } from './helpers/servers.js';
import { fuzzSeed, mixScenarios, runFuzz } from './helpers/wire-fuzz.js';
import { mysqlProtocol, mysqlStream, type MysqlTarget } from './helpers/mysql-fuzz.js';
import { checkNothingHeld, checkRun, FUZZ_CLOSE_MS, FUZZ_FRAMES, fuzzPool, settled } from './helpers/wire-fuzz-checks.js';

const direct = process.env.FUZZ_TARGET === 'direct';
const suffix = randomBytes(4).toString('hex');
const USER = `myfuzz_${suffix}`;
const DB = `myfuzz_${suffix}`;
const PASSWORD = 'fuzz-Pa55';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const seed = fuzzSeed();
  t.comment(`fuzz seed ${seed} (replay with FUZZ_SEED=${seed})${direct ? ', target: MariaDB directly' : ''}`);
  // A user with rights on its own database only (no SHUTDOWN, RELOAD, SUPER...): random commands can do nothing else.
  const root = await mysqlAccount(t, { db: DB, user: USER, password: PASSWORD });
  await root.query(`CREATE TABLE ${DB}.fuzz_uncommitted (id INT AUTO_INCREMENT PRIMARY KEY, note TEXT) ENGINE=InnoDB`);

  const pool = direct ? null : await fuzzPool(t, { port: 3306, name: DB, username: USER, password: PASSWORD });
  const target: MysqlTarget & { port: number } = pool
    ? { port: pool.svc.service.ports.mysql!, user: pool.sub, password: pool.key, database: DB, uncommittedTable: 'fuzz_uncommitted' }
    : { port: 3306, user: USER, password: PASSWORD, database: DB, uncommittedTable: 'fuzz_uncommitted' };
  const governor = () => pool!.dp.governor.state(pool!.poolId);
  const listener = () => {
    const c = pool!.svc.service.mysql!.counts(pool!.poolId);
    return { clients: c.clients, linked: c.inTransaction, serverConnections: c.serverConnections };
  };

  t.test(`${FUZZ_FRAMES} random and mutated packets, spread over bounded connections`, async (t) => {
    const { scenario, stats } = mixScenarios(mysqlProtocol(target, FUZZ_CLOSE_MS));
    const report = await runFuzz({
      host: '127.0.0.1', port: target.port, seed, frames: FUZZ_FRAMES, parallel: 6, maxConnections: 2000, closeMs: FUZZ_CLOSE_MS,
      scenario, stream: mysqlStream(), diagnose: pool ? () => JSON.stringify({ governor: governor(), listener: listener() }) : undefined,
    });
    checkRun(t, report, stats.inserted, 'packets');

    // Sessions of the user still inside a transaction end once the server sees their client gone.
    const open = await settled(async () => {
      const [rows] = await root.query(
        `SELECT COUNT(*) AS n FROM information_schema.INNODB_TRX x JOIN information_schema.PROCESSLIST p ON p.ID = x.trx_mysql_thread_id WHERE p.USER = ?`, [USER]);
      return Number((rows as Array<{ n: number }>)[0]!.n);
    }, (n) => n === 0);
    t.equal(open, 0, 'no upstream session is left inside a transaction');
    const [rows] = await root.query(`SELECT COUNT(*) AS n FROM ${DB}.fuzz_uncommitted`);
    const committed = Number((rows as Array<{ n: number }>)[0]!.n);
    t.equal(committed, 0, 'no row of a transaction the fuzz never committed was committed');
    // Each note holds the number its connection drew: enough to find the connection and replay it.
    if (committed) t.comment(`committed rows: ${JSON.stringify((await root.query(`SELECT note FROM ${DB}.fuzz_uncommitted`))[0])}`);
    if (!pool) return;

    await checkNothingHeld(t, governor, listener);
    t.comment(`listener counts after the fuzz: ${JSON.stringify(listener())}`);
    const c = await mysql.createConnection({ host: '127.0.0.1', port: target.port, user: pool.sub, password: pool.key, database: DB });
    const [answer] = await c.query('SELECT 40 + 2 AS n');
    t.equal(Number((answer as Array<{ n: number }>)[0]!.n), 42, 'a normal mysql2 client still works through the listener');
    await c.end();
  });
}
