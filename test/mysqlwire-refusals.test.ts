// Every refusal poolgate answers itself reads as it should in the real mariadb CLI (issue 20 item 5): a
// server error number and SQLSTATE with poolgate's message, never `ERROR 2027 Received malformed packet`
// (what the CLI made of poolgate's former 2003, a number MySQL keeps for client-side errors). mysql2
// gets the same errno, SQLSTATE and message.
import t from 'tap';
import { needServer } from './helpers/servers.js';
import { mariadbCli, wirePool } from './helpers/mysql-wire.js';
import mysql from 'mysql2/promise';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { MysqlListener } from '../src/db/mysqlwire/listener.js';
import { createLogger } from '../src/log.js';
import type { RequestRecord } from '../src/pool-request/release.js';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const w = await wirePool(t);
  const cli = (args: string[], o: { user?: string; password?: string } = {}) =>
    mariadbCli(['-h', '127.0.0.1', '-P', String(w.port), '-u', o.user ?? w.sub, `-p${o.password ?? w.key}`, '--batch', ...args]);
  const setDbPort = async (port: number) => {
    await w.svc.service.sql.query('UPDATE pools SET db_port = $1 WHERE id = $2', [port, w.poolId]);
    await w.svc.service.sql.notify(CHANGE_CHANNEL, `pool:${w.poolId}`);
    await w.svc.service.dataplane!.snapshots.reload();
  };

  t.test('login refusals: wrong key, unknown pool, another database, suspended pool, address not allowed, HTTP-only policy', async (t) => {
    const bad = await cli(['-e', 'SELECT 1'], { password: 'not-the-key' });
    t.match(bad.stderr, /^ERROR 1045 \(28000\): Access denied for user '[^']+' \(unknown pool or invalid key\)\n$/);
    const unknown = await cli(['-e', 'SELECT 1'], { user: 'no-such-pool' });
    t.match(unknown.stderr, /^ERROR 1045 \(28000\): Access denied for user 'no-such-pool' \(unknown pool or invalid key\)\n$/);
    const otherDb = await cli(['mysql', '-e', 'SELECT 1']);
    t.match(otherDb.stderr, /^ERROR 1044 \(42000\): Access denied for user '[^']+' to database 'mysql' \(the pool's database is 'wire_\w+'\)\n$/);
    await w.setPool(2, { adaptive: false, ipAllowlist: ['10.0.0.0/8'] });
    const host = await cli(['-e', 'SELECT 1']);
    t.match(host.stderr, /^ERROR 1130 \(HY000\): Host '127\.0\.0\.1' is not allowed to use this pool\n$/);
    await w.setPool(2, { adaptive: false, originSigning: true });
    const hmac = await cli(['-e', 'SELECT 1']);
    t.match(hmac.stderr, /^ERROR 1045 \(28000\): the pool requires .*HMAC.*which MySQL clients cannot carry\n$/);
    await w.setPool(2, { adaptive: false });
    await w.svc.service.sql.query("UPDATE pools SET status = 'suspended' WHERE id = $1", [w.poolId]);
    await w.svc.service.dataplane!.snapshots.reload();
    const suspended = await cli(['-e', 'SELECT 1']);
    t.match(suspended.stderr, /^ERROR 1045 \(28000\): Access denied for user '[^']+' \(the pool is suspended\)\n$/);
    await w.svc.service.sql.query("UPDATE pools SET status = 'active' WHERE id = $1", [w.poolId]);
    await w.svc.service.dataplane!.snapshots.reload();
    t.equal((await cli(['-e', 'SELECT 1'])).code, 0, 'and back to working');
  });

  t.test('the database cannot be reached: a server error naming it, not ERROR 2027', async (t) => {
    await setDbPort(1);
    const r = await cli(['-e', 'SELECT 1']);
    t.not(r.code, 0);
    t.notMatch(r.stderr, /2027|malformed/);
    t.match(r.stderr, /^ERROR 1429 \(HY000\) at line 1: cannot reach the database: .+\n$/m);
    const c = await w.connect();
    await t.rejects(c.query('SELECT 1'), { errno: 1429, sqlState: 'HY000', message: /cannot reach the database/ }, 'mysql2 gets the same');
    await setDbPort(3306);
    t.same((await c.query('SELECT 1 AS one'))[0], [{ one: 1 }], 'the session goes on once the database is back');
    await c.end();
  });

  t.test('the pool is busy: queue timeout and queue full', async (t) => {
    await w.setPool(1, { adaptive: false, queueTimeoutMs: 100 });
    const holder = await w.connect();
    await holder.beginTransaction();
    await holder.query('SELECT 1');
    const timeout = await cli(['-e', 'SELECT 1']);
    t.match(timeout.stderr, /^ERROR 1040 \(08004\) at line 1: pool \S+: no slot opened within the queue wait \(\d+ ms\)\n$/m);
    await w.setPool(1, { adaptive: false, queueTimeoutMs: 100, queueLength: 0 });
    const full = await cli(['-e', 'SELECT 1']);
    t.match(full.stderr, /^ERROR 1040 \(08004\) at line 1: pool \S+: (the pool queue is full|no free slot)\n$/m);
    await holder.rollback();
    await holder.end();
    await w.setPool(2, { adaptive: false, rpmOverride: 1 });
    const rate = await cli(['-e', 'SELECT 1; SELECT 2; SELECT 3']);
    t.match(rate.stderr, /^ERROR 1226 \(42000\) at line 1: pool \S+: the request rate limit is reached\n$/m);
    await w.setPool(2, { adaptive: false });
  });

  t.test('refusals are counted by their real outcome: 429 queue full or rate limit, 504 queue timeout (issue 14 bug 7)', async (t) => {
    // Before, every wire refusal was recorded as 429 whatever its cause.
    const records: RequestRecord[] = [];
    const dp = w.svc.service.dataplane!;
    const listener = await MysqlListener.start({
      host: '127.0.0.1',
      port: 0,
      snapshots: dp.snapshots,
      governor: dp.governor,
      metrics: { record: (r) => records.push(r) },
      log: createLogger('silent'),
      allowInsecure: true,
      allowPrivate: true,
    });
    t.teardown(() => listener.close());
    const connect = () => mysql.createConnection({ host: '127.0.0.1', port: listener.port, user: w.sub, password: w.key });
    await w.setPool(1, { adaptive: false, queueTimeoutMs: 100 });
    const holder = await connect();
    await holder.beginTransaction();
    await holder.query('SELECT 1');
    const other = await connect();
    await t.rejects(other.query('SELECT 1'), { errno: 1040 });
    await w.setPool(1, { adaptive: false, queueTimeoutMs: 100, queueLength: 0 });
    await t.rejects(other.query('SELECT 1'), { errno: 1040 });
    await holder.rollback();
    await w.setPool(1, { adaptive: false, rpmOverride: 1 });
    await other.query('SELECT 1').catch(() => {});
    await t.rejects(other.query('SELECT 1'), { errno: 1226 });
    const refused = records.filter((r) => r.admission && !r.admission.ok).map((r) => [r.outcome, r.status]);
    t.same(refused, [['queue_timeout', 504], ['too_many_requests', 429], ['too_many_requests', 429]].slice(0, refused.length), 'each refusal with its own status');
    t.equal(refused.length, 3);
    await holder.end();
    await other.end();
    await w.setPool(2, { adaptive: false });
  });

  t.test('the server connection is lost during a statement', async (t) => {
    const kill = async () => {
      const started = Date.now();
      while ((await w.processes('SLEEP(30)')) === 0 && Date.now() - started < 10_000) await new Promise((r) => setTimeout(r, 50));
      const [rows] = (await w.root.query('SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ? AND INFO LIKE ?', [w.user, '%SLEEP(30)%'])) as any;
      await w.root.query(`KILL CONNECTION ${rows[0].ID}`);
    };
    const viaCli = cli(['-e', 'SELECT SLEEP(30)']);
    await kill();
    const r = await viaCli;
    t.match(r.stderr, /^ERROR 1317 \(70100\) at line 1: Lost connection to the database during the command; any open transaction was rolled back\n$/m);
    const c = await w.connect();
    const running = c.query('SELECT SLEEP(30)').then(() => null, (e: { errno?: number; sqlState?: string; message?: string }) => e);
    await kill();
    t.match(await running, { errno: 1317, sqlState: '70100', message: /Lost connection to the database/ }, 'mysql2 gets the same');
    t.same((await c.query('SELECT 1 AS one'))[0], [{ one: 1 }], 'and its session goes on');
    await c.end();
  });
}
