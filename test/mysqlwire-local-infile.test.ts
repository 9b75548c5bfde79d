// Issue 30, item 5: LOAD DATA LOCAL INFILE through the MySQL listener. The server's request for a file is
// relayed only as the answer to the client's own COM_QUERY, and only to a client that announced
// CLIENT_LOCAL_FILES (its server connection is opened with the same); the file goes back to that server
// connection, whose OK/ERR ends the statement and gives the slot back. MariaDB's COM_STMT_BULK_EXECUTE (the
// connector's batch()) runs with statement ids mapped as for COM_STMT_EXECUTE.
import t from 'tap';
import { Readable } from 'node:stream';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import mysql from 'mysql2/promise';
import mariadb from 'mariadb';
import { needServer } from './helpers/servers.js';
import { mariadbCli, wireFixture } from './helpers/mysql-wire.js';
import { until } from './helpers/until.js';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const { w, listener, governor, direct } = await wireFixture(t, ['CREATE TABLE f (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB']);
  await w.setPool(1, { adaptive: false, queueTimeoutMs: 20_000 });
  const count = async () => ((await direct.query('SELECT COUNT(*) AS n FROM f')) as any)[0][0].n as number;
  const settled = () => until('no slot or connection held', () => governor.state(w.poolId).inFlight === 0 && listener.counts(w.poolId).inTransaction === 0);

  t.test('mysql2 (infileStreamFactory): the file is loaded, the slot comes back, the connection goes on', async (t) => {
    const c = await mysql.createConnection({ host: '127.0.0.1', port: w.port, user: w.sub, password: w.key, database: w.db, infileStreamFactory: () => Readable.from(['1\tone\n2\ttwo\n', '3\tthree\n'].map((s) => Buffer.from(s))) } as any);
    t.teardown(() => c.end().catch(() => {}));
    const [r] = (await c.query("LOAD DATA LOCAL INFILE 'rows.tsv' INTO TABLE f")) as any;
    t.equal(r.affectedRows, 3, "the server's OK after the file");
    t.equal(await count(), 3, 'three rows loaded');
    t.ok(await settled(), 'slot and server connection given back (transaction mode)');
    const [rows] = await c.query('SELECT v FROM f ORDER BY id');
    t.same(rows, [{ v: 'one' }, { v: 'two' }, { v: 'three' }], 'the same connection goes on, in step');
    // A statement the server refuses before asking for a file: its ERR ends the statement; the session goes on.
    await t.rejects(c.query("LOAD DATA LOCAL INFILE 'rows.tsv' INTO TABLE no_such_table"), { errno: 1146 }, 'the ERR reaches the client');
    t.ok(await settled(), 'slot given back after the error');
    t.same((await c.query('SELECT 7 AS seven'))[0], [{ seven: 7 }], 'still in step');
  });

  t.test('in a transaction the file is loaded on the transaction connection, which stays pinned until COMMIT', async (t) => {
    await direct.query('DELETE FROM f');
    const c = await mysql.createConnection({ host: '127.0.0.1', port: w.port, user: w.sub, password: w.key, database: w.db, infileStreamFactory: () => Readable.from(['10\tten\n'].map((s) => Buffer.from(s))) } as any);
    t.teardown(() => c.end().catch(() => {}));
    await c.query('BEGIN');
    await c.query("LOAD DATA LOCAL INFILE 'x' INTO TABLE f");
    t.equal(listener.counts(w.poolId).inTransaction, 1, 'the transaction keeps its connection');
    t.equal(await count(), 0, 'not visible outside before COMMIT');
    await c.query('COMMIT');
    t.equal(await count(), 1, 'committed');
    t.ok(await settled(), 'released at COMMIT');
  });

  t.test('a client that did not announce CLIENT_LOCAL_FILES: the server is never asked to use it', async (t) => {
    await direct.query('DELETE FROM f');
    let asked = 0;
    const c = await mysql.createConnection({
      host: '127.0.0.1', port: w.port, user: w.sub, password: w.key, database: w.db, flags: ['-LOCAL_FILES'],
      infileStreamFactory: () => { asked++; return Readable.from(['1\tone\n'].map((s) => Buffer.from(s))); },
    } as any);
    t.teardown(() => c.end().catch(() => {}));
    await t.rejects(c.query("LOAD DATA LOCAL INFILE 'x' INTO TABLE f"), { errno: 4166 }, "the server's own refusal (its connection was opened without the capability)");
    t.equal(asked, 0, 'the client was never asked for a file');
    t.equal(await count(), 0, 'nothing loaded');
    t.ok(await settled(), 'slot given back');
    t.same((await c.query('SELECT 1 AS one'))[0], [{ one: 1 }], 'the connection goes on');
  });

  t.test('MariaDB Connector/Node.js (permitLocalInfile) and the mariadb CLI load a file', async (t) => {
    await direct.query('DELETE FROM f');
    const conn = await mariadb.createConnection({ host: '127.0.0.1', port: w.port, user: w.sub, password: w.key, database: w.db, permitLocalInfile: true, infileStreamFactory: () => Readable.from(['20\ttwenty\n21\ttwenty-one\n'].map((s) => Buffer.from(s))) } as any);
    t.teardown(() => conn.end().catch(() => {}));
    const r = await conn.query("LOAD DATA LOCAL INFILE 'y' INTO TABLE f");
    t.equal(Number(r.affectedRows), 2, 'mariadb connector: two rows');
    t.same(await conn.query('SELECT COUNT(*) AS n FROM f'), [{ n: 2n }], 'and the connection goes on');
    const file = join(await mkdtemp(join(tmpdir(), 'infile-')), 'rows.tsv');
    await writeFile(file, '30\tthirty\n');
    const cli = await mariadbCli(['-h', '127.0.0.1', '-P', String(w.port), '-u', w.sub, `-p${w.key}`, '--batch', '--local-infile=1', w.db, '-e', `LOAD DATA LOCAL INFILE '${file}' INTO TABLE f; SELECT COUNT(*) AS n FROM f`]);
    t.equal(cli.code, 0, cli.stderr);
    t.equal(cli.stdout, 'n\n3\n', 'the mariadb CLI loads a file, and its next statement in the same packet runs');
    t.ok(await settled(), 'slot given back');
  });

  t.test("MariaDB: COM_STMT_BULK_EXECUTE runs with the client's statement ids mapped (the connector's batch())", async (t) => {
    await direct.query('DELETE FROM f');
    const conn = await mariadb.createConnection({ host: '127.0.0.1', port: w.port, user: w.sub, password: w.key, database: w.db, bulk: true });
    t.teardown(() => conn.end().catch(() => {}));
    const bulk = 2n ** 34n; // MARIADB_CLIENT_STMT_BULK_OPERATIONS (extended capability 1 << 2, shifted up 32 bits)
    t.not(((conn as any).info.serverCapabilities & bulk), 0n, 'the greeting offers bulk operations, as MariaDB does');
    // Counted on the server session that runs the batch (a transaction keeps it), not server-wide: other test files
    // execute statements on the same MariaDB at the same time.
    const executes = async () => Number(((await conn.query("SHOW SESSION STATUS LIKE 'Com_stmt_execute'")) as any)[0].Value);
    await conn.beginTransaction();
    const before = await executes();
    const r = await conn.batch('INSERT INTO f VALUES (?, ?)', [[1, 'a'], [2, 'b'], [3, 'c']]);
    t.equal(Number((r as any).affectedRows), 3, 'three rows inserted in one command');
    const after = await executes();
    await conn.commit();
    t.ok(after - before <= 1, `one execute upstream (bulk), not one per row (${after - before})`);
    t.same(await conn.query('SELECT v FROM f ORDER BY id'), [{ v: 'a' }, { v: 'b' }, { v: 'c' }], 'all of them');
    // Again, with the statement cached by the connector: another server connection may run it (prepared there first).
    await conn.batch('INSERT INTO f VALUES (?, ?)', [[4, 'd'], [5, 'e']]);
    await t.rejects(conn.batch('INSERT INTO f VALUES (?, ?)', [[6, 'f'], [1, 'dup']]), { errno: 1062 }, "a duplicate key: the server's ERR");
    t.same(await conn.query('SELECT v FROM f WHERE id = 5'), [{ v: 'e' }], 'the connection goes on');
    t.ok(await settled(), 'slot given back');
  });
}
