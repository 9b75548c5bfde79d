// Automatic pinning in statement pooling (issue 14): a client that creates session state stays on its server
// connection, holding its slot, until the state is gone or it leaves; the connection is reset before anyone
// else gets it. Each kind is interleaved on a pool with one server connection: the second client waits while
// the first is pinned, the first always finds its state, the second never sees it.
import t, { type Test } from 'tap';
import type { Connection } from 'mysql2/promise';
import { needServer } from './helpers/servers.js';
import { wirePool } from './helpers/mysql-wire.js';
import { until } from './helpers/until.js';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const w = await wirePool(t);
  await w.setPool(1, { adaptive: false });
  const setup = await w.connect();
  await setup.query('CREATE TABLE t (id INT PRIMARY KEY)');
  await setup.query('INSERT INTO t VALUES (1), (2)');
  await setup.end();
  const one = async (c: Connection, sql: string) => ((await c.query(sql)) as any)[0][0];
  const metric = async (name: string, reason: string) => {
    const text = await (await fetch(`${w.svc.metricsUrl}/metrics`)).text();
    const line = text.split('\n').find((l) => l.startsWith(name + '{') && l.includes(`pool="${w.sub}"`) && l.includes('protocol="mysql"') && l.includes(`reason="${reason}"`));
    return line ? Number(line.split(' ').pop()) : 0;
  };

  interface Kind {
    reason: string;
    /** Creates the state. */
    make: string[];
    /** The first client's check that it kept it (run twice, around the second client's wait). */
    kept: (t: Test, c: Connection) => Promise<unknown>;
    /** Drops the state while connected (the client is unpinned); absent: it is kept until the client leaves. */
    release?: string;
    /** The second client's check that it does not see it. */
    unseen: (t: Test, c: Connection) => Promise<unknown>;
  }

  const kinds: Record<string, Kind> = {
    'SET @user_variable': {
      reason: 'user_variable',
      make: ["SET @v = 'of a'"],
      kept: async (t, c) => t.equal((await one(c, 'SELECT @v AS v')).v, 'of a'),
      unseen: async (t, c) => t.equal((await one(c, 'SELECT @v AS v')).v, null),
    },
    'SELECT … INTO @variable': {
      reason: 'user_variable',
      make: ["SELECT 'into a' INTO @i"],
      kept: async (t, c) => t.equal((await one(c, 'SELECT @i AS i')).i, 'into a'),
      unseen: async (t, c) => t.equal((await one(c, 'SELECT @i AS i')).i, null),
    },
    '@variable := in a SELECT': {
      reason: 'user_variable',
      make: ['SELECT @n := COUNT(*) AS n FROM t'],
      kept: async (t, c) => t.equal(Number((await one(c, 'SELECT @n AS n')).n), 2),
      unseen: async (t, c) => t.equal((await one(c, 'SELECT @n AS n')).n, null),
    },
    'SET SESSION system variable': {
      reason: 'set',
      make: ["SET SESSION sql_mode = 'ANSI_QUOTES'"],
      kept: async (t, c) => t.equal(Number((await one(c, "SELECT @@SESSION.sql_mode LIKE '%ANSI_QUOTES%' AS q")).q), 1),
      unseen: async (t, c) => t.equal(Number((await one(c, "SELECT @@SESSION.sql_mode LIKE '%ANSI_QUOTES%' AS q")).q), 0),
    },
    'SET NAMES': {
      reason: 'set',
      make: ['SET NAMES latin1'],
      kept: async (t, c) => t.equal((await one(c, 'SELECT @@character_set_client AS cs')).cs, 'latin1'),
      unseen: async (t, c) => t.not((await one(c, 'SELECT @@character_set_client AS cs')).cs, 'latin1'),
    },
    'CREATE TEMPORARY TABLE': {
      reason: 'temp_table',
      make: ['CREATE TEMPORARY TABLE tmp (x INT)', 'INSERT INTO tmp VALUES (7)'],
      kept: async (t, c) => t.equal(Number((await one(c, 'SELECT SUM(x) AS s FROM tmp')).s), 7),
      unseen: async (t, c) => t.rejects(c.query('SELECT * FROM tmp'), { errno: 1146 }),
    },
    'GET_LOCK, then RELEASE_ALL_LOCKS': {
      reason: 'get_lock',
      make: ["SELECT GET_LOCK('lock_a', 0)"],
      kept: async (t, c) => t.equal(Number((await one(c, "SELECT IS_USED_LOCK('lock_a') = CONNECTION_ID() AS mine")).mine), 1),
      release: 'SELECT RELEASE_ALL_LOCKS()',
      unseen: async (t, c) => t.equal((await one(c, "SELECT IS_USED_LOCK('lock_a') AS l")).l, null),
    },
    'LOCK TABLES, then UNLOCK TABLES': {
      reason: 'lock_tables',
      make: ['LOCK TABLES t WRITE'],
      kept: async (t, c) => {
        await c.query('INSERT INTO t VALUES (3)');
        await c.query('DELETE FROM t WHERE id = 3');
        t.pass('writes under its table lock');
      },
      release: 'UNLOCK TABLES',
      unseen: async (t, c) => t.equal(Number((await one(c, 'SELECT COUNT(*) AS n FROM t')).n), 2, 'reads t: no lock of the other client in the way'),
    },
    'USE another database, then USE the pool database': {
      reason: 'use_database',
      make: ['USE information_schema'],
      kept: async (t, c) => t.equal((await one(c, 'SELECT DATABASE() AS d')).d, 'information_schema'),
      release: `USE ${w.db}`,
      unseen: async (t, c) => t.equal((await one(c, 'SELECT DATABASE() AS d')).d, w.db),
    },
    'PREPARE (SQL)': {
      reason: 'prepared_statement',
      make: ["PREPARE s1 FROM 'SELECT 41 + 1 AS v'"],
      kept: async (t, c) => t.equal(Number((await one(c, 'EXECUTE s1')).v), 42),
      unseen: async (t, c) => t.rejects(c.query('EXECUTE s1'), { errno: 1243 }),
    },
  };

  for (const [name, k] of Object.entries(kinds)) {
    t.test(`${name}: pinned (${k.reason}) while the state lasts, never seen by the next client`, async (t) => {
      const a = await w.connect();
      const pinsBefore = await metric('poolgate_wire_pins_total', k.reason);
      for (const sql of k.make) await a.query(sql);
      await k.kept(t, a);
      const [[ida]] = (await a.query('SELECT CONNECTION_ID() AS id')) as any;
      t.equal(await metric('poolgate_wire_pinned_clients', k.reason), 1, 'the gauge shows the pinned client');
      t.equal(await metric('poolgate_wire_pins_total', k.reason), pinsBefore + 1, 'and the counter its pin');
      const b = await w.connect();
      let bDone = false;
      const bRuns = (async () => {
        const [[idb]] = (await b.query('SELECT CONNECTION_ID() AS id')) as any;
        bDone = true;
        return idb.id;
      })();
      // The positive signal: the second client's statement waits in the pool's queue for the one slot.
      await until('the second client queued for the slot', () => w.svc.service.dataplane!.governor.state(w.poolId).queued === 1);
      t.equal(bDone, false, 'the second client waits: the pinned client holds the one slot');
      await k.kept(t, a);
      t.equal((((await a.query('SELECT CONNECTION_ID() AS id')) as any)[0][0]).id, ida.id, 'still on its server connection');
      if (k.release) {
        await a.query(k.release);
        t.equal(await bRuns, ida.id, 'unpinned when the state is gone: the second client gets the same server connection, reset');
        t.equal(await metric('poolgate_wire_pinned_clients', k.reason), 0);
      } else {
        await a.end();
        t.equal(await bRuns, ida.id, 'once the first leaves, the second gets the same server connection, reset');
      }
      await k.unseen(t, b);
      await b.end();
      if (k.release) await a.end();
      t.equal(await metric('poolgate_wire_pinned_clients', k.reason), 0, 'nobody pinned at the end');
    });
  }

  t.test('a statement that only reads session state does not pin; a failed one pins nothing', async (t) => {
    const a = await w.connect();
    await a.query('SELECT @never AS v, @@SESSION.sql_mode AS m');
    await t.rejects(a.query('SET @x = (SELECT nope FROM t)'), { errno: 1054 });
    t.equal(w.svc.service.mysql!.counts(w.poolId).inTransaction, 0, 'no slot kept between statements');
    const b = await w.connect();
    t.same((await b.query('SELECT 1 AS one'))[0], [{ one: 1 }], 'the other client runs at once');
    await a.end();
    await b.end();
  });

  t.test("a prepared statement (binary protocol) that sets state pins like the text one (MariaDB prepares SET and USE)", async (t) => {
    const a = await w.connect();
    await a.execute("SET @p = 'prepared'");
    t.equal((await one(a, 'SELECT @p AS p')).p, 'prepared', 'kept from an execute to a query');
    await a.end();
    const b = await w.connect();
    t.equal((await one(b, 'SELECT @p AS p')).p, null);
    await b.end();
  });

  t.test("wireSessionState 'refuse': such statements get ERR 1235 naming the setting, and change nothing", async (t) => {
    await w.setPool(1, { adaptive: false, wireSessionState: 'refuse' });
    const a = await w.connect();
    for (const sql of ["SET @v = 1", "SELECT 1 INTO @v", "SET SESSION sql_mode = ''", 'CREATE TEMPORARY TABLE tmp2 (x INT)', "SELECT GET_LOCK('r', 0)", 'LOCK TABLES t READ', 'USE information_schema', "PREPARE s FROM 'SELECT 1'"]) {
      await t.rejects(a.query(sql), { errno: 1235, sqlState: '42000', message: /wireSessionState/ }, sql);
    }
    await t.rejects(a.execute("SET @w = 2"), { errno: 1235 }, 'a prepared SET too');
    const seen = await one(a, `SELECT @v AS v, DATABASE() AS d, IS_USED_LOCK('r') AS l`);
    t.same(seen, { v: null, d: w.db, l: null }, 'nothing was run');
    t.equal(w.svc.service.mysql!.counts(w.poolId).inTransaction, 0, 'and no slot is held');
    t.same((await a.query('SELECT 2 AS two'))[0], [{ two: 2 }], 'ordinary statements run');
    await a.end();
    await w.setPool(1, { adaptive: false });
  });

  t.test('no slot held and no server connection leaked at the end', async (t) => {
    // The last clients' ends settle after their end() returned: wait for that state, within the ceiling.
    await until('the slot released', () => w.svc.service.dataplane!.governor.state(w.poolId).inFlight === 0);
    t.equal(w.svc.service.dataplane!.governor.state(w.poolId).inFlight, 0);
    t.equal(w.svc.service.mysql!.counts(w.poolId).inTransaction, 0);
  });
}
