// Issue 30, items 1, 3 and 4, with real clients against the local MariaDB: the MariaDB connector's direct
// execute (COM_STMT_PREPARE and, without waiting, COM_STMT_EXECUTE of statement -1) runs; an ERR as the
// first answer on a new server connection gives the slot and the connection back at once; wirePoolMode
// 'session' keeps each client on its own server connection.
import t from 'tap';
import mysql from 'mysql2/promise';
import mariadb from 'mariadb';
import { needServer } from './helpers/servers.js';
import { wireFixture } from './helpers/mysql-wire.js';
import { until } from './helpers/until.js';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const { w, listener, governor, direct } = await wireFixture(t, ['CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB', "INSERT INTO t VALUES (1, 'one'), (2, 'two')"]);

  // First: it needs a pool with no server connection yet.
  t.test('an ERR as the first answer on a new server connection gives the slot and connection back (item 3)', async (t) => {
    await w.setPool(1, { adaptive: false, requestTimeoutMs: 5_000, queueTimeoutMs: 20_000 });
    t.equal(listener.counts(w.poolId).serverConnections, 0, 'no server connection open yet');
    const a = await w.connect();
    const b = await w.connect();
    await t.rejects(a.query('SELECT * FROM no_such_table'), { errno: 1146 }, "the server's ERR reaches A");
    t.equal(listener.counts(w.poolId).inTransaction, 0, 'A holds no connection after its error');
    t.equal(governor.state(w.poolId).inFlight, 0, 'and no slot');
    const started = performance.now();
    const [rows] = await b.query('SELECT 1 AS one');
    const ms = performance.now() - started;
    t.same(rows, [{ one: 1 }]);
    t.ok(ms < 2_000, `B's statement answered in ${Math.round(ms)} ms, not after A's request timeout`);
    const [again] = await a.query('SELECT 2 AS two');
    t.same(again, [{ two: 2 }], "A's session goes on");
    await Promise.all([a.end(), b.end()]);
  });

  t.test("MariaDB Connector/Node.js: execute() of an uncached statement (direct execute, id 0xFFFFFFFF) (item 1)", async (t) => {
    await w.setPool(4, { adaptive: false });
    const conn = await mariadb.createConnection({ host: '127.0.0.1', port: w.port, user: w.sub, password: w.key, database: w.db, connectTimeout: 20_000 });
    t.teardown(() => conn.end().catch(() => {}));
    t.ok(conn.info?.isMariaDB(), `the greeting announces MariaDB (${conn.serverVersion()}), so the connector pipelines prepare and execute`);
    t.same(await conn.execute('SELECT v FROM t WHERE id = ?', [2]), [{ v: 'two' }], 'first execute: prepared and run in one round trip');
    t.same(await conn.execute('SELECT v FROM t WHERE id = ?', [1]), [{ v: 'one' }], 'again, from the cache');
    t.same((await conn.execute('SELECT CAST(? AS CHAR) AS s', [41])), [{ s: '41' }], 'another uncached statement');
    await t.rejects(conn.execute('SELECT * FROM no_such_table WHERE id = ?', [1]), { errno: 1146 }, "a failed prepare: the server's error, and the execute that followed it is refused quietly");
    t.same(await conn.execute('SELECT v FROM t WHERE id = ?', [2]), [{ v: 'two' }], 'the connection is still in step');
    const st = await conn.prepare('INSERT INTO t VALUES (?, ?)');
    await st.execute([3, 'three']);
    st.close();
    t.same(await conn.query('SELECT v FROM t WHERE id = 3'), [{ v: 'three' }], 'prepare() then execute()');
    t.equal(governor.state(w.poolId).inFlight, 0, 'no slot left held');
  });

  t.test("wirePoolMode 'session' keeps each client on its own server connection (item 4)", async (t) => {
    await w.setPool(2, { adaptive: false, wirePoolMode: 'session', queueTimeoutMs: 20_000 });
    const a = await w.connect();
    const b = await w.connect();
    const id = async (c: mysql.Connection) => ((await c.query('SELECT CONNECTION_ID() AS id'))[0] as Array<{ id: number }>)[0]!.id;
    const a1 = await id(a);
    const b1 = await id(b);
    const a2 = await id(a);
    t.not(a1, b1, 'two open sessions never share a server connection');
    t.equal(a2, a1, 'A stays on its own');
    t.equal(listener.counts(w.poolId).inTransaction, 2, 'both hold their connection between statements');
    t.equal(governor.state(w.poolId).inFlight, 2, 'and a slot each');
    await a.query('SET @mine = 7');
    t.same((await b.query('SELECT @mine AS m'))[0], [{ m: null }], "B does not see A's session");
    t.same((await a.query('SELECT @mine AS m'))[0], [{ m: 7 }], 'A does');
    await a.end();
    t.ok(await until("A's slot back", () => governor.state(w.poolId).inFlight === 1), "A's slot comes back when it leaves");
    const c = await w.connect();
    t.not(await id(c), b1, 'a new session does not get the connection B holds');
    await Promise.all([b.end(), c.end()]);
    t.ok(await until('every slot back', () => governor.state(w.poolId).inFlight === 0), 'every slot back');
  });

  t.test('COM_STMT_EXECUTE with parameters that do not fit the statement: ERR 1835, as the server answers (the connector expects it)', async (t) => {
    await w.setPool(2, { adaptive: false });
    const conn = await mariadb.createConnection({ host: '127.0.0.1', port: w.port, user: w.sub, password: w.key, database: w.db, namedPlaceholders: true, connectTimeout: 20_000 });
    t.teardown(() => conn.end().catch(() => {}));
    await t.rejects(conn.execute('select ? as val1, ? as val3', ['30', '10']), { errno: 1835, sqlState: 'HY000' }, 'Malformed communication packet');
    t.same(await conn.query('SELECT 1 AS one'), [{ one: 1 }], 'the connection goes on');
    t.equal(governor.state(w.poolId).inFlight, 0, 'no slot held');
  });

  t.test('a server session kept for a pinned client that the server ends (wait_timeout) ends the client session at once', async (t) => {
    await w.setPool(2, { adaptive: false });
    const c = await w.connect();
    const ended = new Promise<string>((resolve) => {
      c.on('error', (e: any) => resolve(`error ${e.code}`));
      c.connection.stream.once('close', () => resolve('closed'));
    });
    await c.query('SET @@wait_timeout = 1');
    t.equal(listener.counts(w.poolId).inTransaction, 1, 'pinned by the SET');
    const how = await Promise.race([ended, new Promise<string>((r) => setTimeout(() => r('still open'), 8_000))]);
    t.not(how, 'still open', `the client's connection ends when the server's does (${how})`);
    t.ok(await until('slot back', () => governor.state(w.poolId).inFlight === 0 && listener.counts(w.poolId).inTransaction === 0), 'slot and pin given back');
    const d = await w.connect();
    t.same((await d.query('SELECT 1 AS one'))[0], [{ one: 1 }], 'the pool goes on');
    await d.end();
  });
}
