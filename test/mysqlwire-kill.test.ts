// Issue 30 item 2: KILL [QUERY] <id> names a connection id poolgate's greeting gave, never a server thread.
// It reaches the session with that id when that session is the killer's own (same pool, same key: the
// mariadb CLI's Ctrl-C and the connectors' destroy() send it from a second connection), stopping the
// statement on the server connection it runs on; any other id is ERR 1094 and nothing is killed; a KILL
// poolgate cannot map never reaches the server.
import t from 'tap';
import mysql from 'mysql2/promise';
import mariadb from 'mariadb';
import { MYSQL, needServer } from './helpers/servers.js';
import { wirePool } from './helpers/mysql-wire.js';
import { until } from './helpers/until.js';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const w = await wirePool(t);
  const governor = w.svc.service.dataplane!.governor;
  const direct = await mysql.createConnection({ ...MYSQL, database: w.db });
  t.teardown(() => direct.end());
  await direct.query('CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB');
  await w.setPool(6, { adaptive: false, queueTimeoutMs: 20_000, requestTimeoutMs: 60_000 });
  const otherKey: string = (await w.svc.api('POST', `/api/v1/pools/${w.sub}/keys`, { token: w.token, body: { label: 'other' } })).body.data.key;
  await w.svc.service.dataplane!.snapshots.reload();
  const sleeping = (n: string) => w.processes(`SLEEP(${n}`);

  t.test('KILL QUERY <greeting id> from a second connection with the same key stops the statement (Ctrl-C in the mariadb CLI)', async (t) => {
    const a = await w.connect();
    const b = await w.connect();
    const started = performance.now();
    const q = a.query('SELECT SLEEP(20) AS s').then(
      ([rows]) => ({ rows }),
      (err: { errno?: number }) => ({ err }),
    );
    t.ok(await until('the statement runs upstream', async () => (await sleeping('20')) === 1, 10_000), 'the statement runs upstream');
    await b.query(`KILL QUERY ${a.threadId}`);
    const r = await q;
    const ms = performance.now() - started;
    t.ok(ms < 10_000, `A's statement ended after ${Math.round(ms)} ms, not 20 s (${JSON.stringify(r)})`);
    t.ok(await until('nothing sleeps upstream', async () => (await sleeping('20')) === 0, 5_000), 'nothing sleeps upstream');
    t.same((await a.query('SELECT 1 AS one'))[0], [{ one: 1 }], "A's session goes on");
    t.ok(await until('no slot held', () => governor.state(w.poolId).inFlight === 0), 'no slot held');
    await Promise.all([a.end(), b.end()]);
  });

  t.test('an id that is not the client\'s own is ERR 1094 and kills nothing', async (t) => {
    const a = await w.connect();
    const stranger = await w.connect({ password: otherKey });
    const b = await w.connect();
    await a.beginTransaction();
    await a.query('INSERT INTO t VALUES (1)');
    const serverId = ((await a.query('SELECT CONNECTION_ID() AS id'))[0] as Array<{ id: number }>)[0]!.id;
    await t.rejects(stranger.query(`KILL ${a.threadId}`), { errno: 1094 }, 'another key: KILL <id> refused');
    await t.rejects(stranger.query(`KILL QUERY ${a.threadId}`), { errno: 1094 }, 'and KILL QUERY <id>');
    await t.rejects(b.query(`KILL ${serverId}`), { errno: 1094 }, "the server thread id of A's connection is no id of a client's");
    await t.rejects(b.query('KILL 2147483000'), { errno: 1094 }, 'an id nobody has');
    const [alive] = await direct.query('SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE ID = ?', [serverId]);
    t.equal(Number((alive as Array<{ n: number }>)[0]!.n), 1, "A's server connection is alive");
    await a.commit();
    t.same((await a.query('SELECT id FROM t'))[0], [{ id: 1 }], "A's transaction committed");
    await Promise.all([a.end(), b.end(), stranger.end()]);
    await direct.query('DELETE FROM t');
  });

  t.test('KILL <id> with the same key ends that session; its transaction is rolled back', async (t) => {
    const a = await w.connect();
    a.on('error', () => {});
    const b = await w.connect();
    await a.beginTransaction();
    await a.query('INSERT INTO t VALUES (2)');
    await b.query(`KILL ${a.threadId}`);
    await t.rejects(a.query('SELECT 1'), 'A is disconnected');
    t.ok(await until('its insert was rolled back', async () => ((await direct.query('SELECT COUNT(*) AS n FROM t'))[0] as Array<{ n: number }>)[0]!.n == 0), 'its insert was rolled back');
    t.same((await b.query('SELECT 1 AS one'))[0], [{ one: 1 }], 'the killer goes on');
    await b.end();
  });

  t.test('a KILL poolgate cannot map never reaches the server', async (t) => {
    const a = await w.connect({ multipleStatements: true });
    await t.rejects(a.query(`KILL USER ${w.user}`), { errno: 1235 }, 'KILL USER');
    await t.rejects(a.query('KILL QUERY ID 5'), { errno: 1235 }, 'KILL QUERY ID');
    await t.rejects(a.query(`SELECT 1; KILL ${a.threadId}`), { errno: 1235 }, 'KILL among other statements');
    await t.rejects(a.query("EXECUTE IMMEDIATE 'KILL 5'"), { errno: 1235 }, 'EXECUTE IMMEDIATE of a KILL');
    await t.rejects(a.execute('KILL ?', [5]), { errno: 1235 }, 'a prepared KILL');
    t.same((await a.query("SELECT 'kill' AS w"))[0], [{ w: 'kill' }], "the word in a string is not a KILL");
    await a.query(`KILL QUERY ${a.threadId}`);
    t.pass('KILL QUERY of its own id, with nothing else running: OK');
    await a.end();
  });

  t.test("MariaDB Connector/Node.js: destroy() during a query stops it upstream", async (t) => {
    const conn = await mariadb.createConnection({ host: '127.0.0.1', port: w.port, user: w.sub, password: w.key, database: w.db, connectTimeout: 20_000 });
    const q = conn.query('SELECT SLEEP(20)').catch((err: Error) => err);
    t.ok(await until('the statement runs upstream', async () => (await sleeping('20')) === 1, 10_000), 'the statement runs upstream');
    const started = performance.now();
    conn.destroy();
    t.ok((await q) instanceof Error, 'the query ends with an error');
    t.ok(await until('nothing sleeps upstream', async () => (await sleeping('20')) === 0, 8_000), `nothing sleeps upstream after ${Math.round(performance.now() - started)} ms`);
    t.ok(await until('no slot held', () => governor.state(w.poolId).inFlight === 0), 'no slot held');
  });

  t.test('KILL [QUERY] CONNECTION_ID() is the session itself, answered as the server answers it (the connectors\' pool tests)', async (t) => {
    const a = await w.connect();
    await t.rejects(a.query('KILL QUERY CONNECTION_ID()'), { errno: 1317, sqlState: '70100' }, 'KILL QUERY: the KILL itself is interrupted');
    t.same((await a.query('SELECT 1 AS one'))[0], [{ one: 1 }], 'and the session goes on');
    await a.query('BEGIN');
    await a.query('INSERT INTO t VALUES (77)');
    await t.rejects(a.query('KILL CONNECTION_ID()'), { errno: 1927, sqlState: '70100' }, 'KILL: ER_CONNECTION_KILLED');
    await t.rejects(a.query('SELECT 1'), 'then the session is closed');
    t.ok(await until('no slot held', () => governor.state(w.poolId).inFlight === 0), 'its slot comes back');
    t.same((await direct.query('SELECT COUNT(*) AS n FROM t WHERE id = 77'))[0], [{ n: 0 }], 'its transaction was rolled back');
    const conn = await mariadb.createConnection({ host: '127.0.0.1', port: w.port, user: w.sub, password: w.key, database: w.db, connectTimeout: 20_000 });
    conn.on('error', () => {});
    await t.rejects(conn.query('KILL CONNECTION_ID()'), { sqlState: '70100' }, 'MariaDB connector: 70100');
    await t.rejects(conn.query('SELECT 1'), 'its connection is closed');
  });
}
