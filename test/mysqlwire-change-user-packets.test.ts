// Issue 30 item 5, with real clients against the local MariaDB: COM_CHANGE_USER to the same pool resets the
// session (the key checked again), to another user is a clear refusal that changes nothing; packets of
// 16 MiB or more arrive split and go to the server split the same way.
import t from 'tap';
import mysql from 'mysql2/promise';
import mariadb from 'mariadb';
import { needServer } from './helpers/servers.js';
import { wirePool } from './helpers/mysql-wire.js';
import { until } from './helpers/until.js';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const w = await wirePool(t);
  const governor = w.svc.service.dataplane!.governor;
  await w.setPool(4, { adaptive: false });

  t.test('COM_CHANGE_USER to the same pool resets the session; to another user it is refused', async (t) => {
    const a = await w.connect();
    await a.query('SET @v = 1');
    await a.query('CREATE TEMPORARY TABLE tmp (x INT)');
    t.equal(governor.state(w.poolId).inFlight, 1, 'pinned by its session state');
    await a.changeUser({ user: w.sub, password: w.key });
    t.same((await a.query('SELECT @v AS v'))[0], [{ v: null }], 'mysql2 changeUser: variables gone');
    await t.rejects(a.query('SELECT * FROM tmp'), { errno: 1146 }, 'temporary table gone');
    t.equal(governor.state(w.poolId).inFlight, 0, 'its slot given back');
    await a.query('SET @v = 2');
    await t.rejects(a.changeUser({ user: 'someone_else', password: 'x' }), { errno: 1235 }, 'another user: refused');
    t.same((await a.query('SELECT @v AS v'))[0], [{ v: 2 }], 'and the session is unchanged');
    await a.end();

    const m = await mariadb.createConnection({ host: '127.0.0.1', port: w.port, user: w.sub, password: w.key, database: w.db, connectTimeout: 20_000 });
    await m.query('SET @v = 3');
    await m.changeUser({ user: w.sub, password: w.key });
    t.same(await m.query('SELECT @v AS v'), [{ v: null }], 'MariaDB connector changeUser: reset');
    await m.end();

    const bad = await w.connect();
    bad.on('error', () => {});
    await t.rejects(bad.changeUser({ user: w.sub, password: 'not-the-key' }), { errno: 1045 }, 'a wrong key: access denied');
    await until('no slot held', () => governor.state(w.poolId).inFlight === 0, 5000);
  });

  t.test('packets of 16 MiB and more: split as the protocol does, both ways', async (t) => {
    const a = await w.connect();
    // SELECT LENGTH('…') AS n: 23 bytes around the literal. A payload of exactly 0xFFFFFF bytes goes as a full
    // piece and an empty one (MariaDB's max_allowed_packet here, 16 MiB, refuses one byte more, itself).
    const n = 0xffffff - 23;
    t.same((await a.query(`SELECT LENGTH('${'x'.repeat(n)}') AS n`))[0], [{ n }], `a statement of ${n + 23} bytes`);
    await t.rejects(a.query(`SELECT LENGTH('${'x'.repeat(n + 1)}') AS n`), { errno: 1153 }, "one byte more: the server's own refusal, passed on");
    // Each value within max_allowed_packet, the row over 16 MiB: the server splits it, poolgate passes it on.
    const [rows] = await a.query("SELECT REPEAT('y', 16777000) AS s, REPEAT('z', 5000) AS z");
    const row = (rows as Array<{ s: string; z: string }>)[0]!;
    t.same([row.s.length, row.z.length], [16777000, 5000], 'a result row over 16 MiB comes back whole');
    t.same((await a.query('SELECT 1 AS one'))[0], [{ one: 1 }], 'the session is in step');
    await a.end();
  });
}

