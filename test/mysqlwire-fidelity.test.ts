// Wire fidelity for real MySQL clients (issue 14): what mysql2 gets through poolgate is what it gets from
// MariaDB directly.
import t from 'tap';
import mysql from 'mysql2/promise';
import { MYSQL, needServer } from './helpers/servers.js';
import { wirePool } from './helpers/mysql-wire.js';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const w = await wirePool(t);
  const direct = await mysql.createConnection({ ...MYSQL, database: w.db });
  t.teardown(() => direct.end());

  t.test('a JSON-typed execute parameter (mysql2 sends arrays and objects as type 0xF5) answers as MariaDB does directly', async (t) => {
    // Issue 14 bug 4: through poolgate this was ER_WRONG_ARGUMENTS 1210, directly "[1,2]".
    const c = await w.connect();
    const [[viaPoolgate]] = (await c.execute('SELECT ? AS a, ? AS b, ? AS c', [[1, 2], { x: 'é' }, 'plain'])) as any;
    const [[viaDirect]] = (await direct.execute('SELECT ? AS a, ? AS b, ? AS c', [[1, 2], { x: 'é' }, 'plain'])) as any;
    t.same(viaDirect, { a: '[1,2]', b: '{"x":"é"}', c: 'plain' }, 'MariaDB directly');
    t.same(viaPoolgate, viaDirect, 'the same through poolgate');
    await c.query('CREATE TABLE docs (id INT PRIMARY KEY, doc JSON)');
    await c.execute('INSERT INTO docs VALUES (?, ?)', [1, { tags: ['a', 'b'] }]);
    // The same statement again (types not re-sent by mysql2 are replayed by poolgate) on another value.
    await c.execute('INSERT INTO docs VALUES (?, ?)', [2, [3, 4]]);
    const [rows] = (await c.execute('SELECT id, JSON_EXTRACT(doc, ?) AS tag, JSON_LENGTH(doc) AS n FROM docs ORDER BY id', ['$.tags[1]'])) as any;
    t.same(rows, [{ id: 1, tag: '"b"', n: 1 }, { id: 2, tag: null, n: 2 }], 'the documents were stored as sent');
    await c.end();
  });

  // The failure classes left in mysql2's own integration suite through poolgate (docs/decisions/mysqlwire.md,
  // "mysql2's integration suite"), reproduced here since CI cannot fetch it. Each pins today's behaviour.
  t.test('known difference: a MariaDB JSON column reaches mysql2 as text (poolgate offers no MariaDB extended metadata)', async (t) => {
    // mysql2 asks MariaDB for extended column metadata (format "json") only when the server version says
    // MariaDB; poolgate announces a MySQL version before it knows the pool, so JSON columns are LONGTEXT to it.
    await direct.query('CREATE TABLE IF NOT EXISTS jdocs (id INT PRIMARY KEY, doc JSON)');
    await direct.query(`REPLACE INTO jdocs VALUES (1, '{"a":1}')`);
    const [[viaDirect]] = (await direct.query('SELECT doc FROM jdocs WHERE id = 1')) as any;
    t.same(viaDirect.doc, { a: 1 }, 'directly: parsed');
    const c = await w.connect();
    const [[viaPoolgate]] = (await c.query('SELECT doc FROM jdocs WHERE id = 1')) as any;
    t.equal(viaPoolgate.doc, '{"a":1}', 'through poolgate: the JSON text, to be parsed by the application');
    await c.end();
  });

  t.test('known difference: SET character_set_client is kept on the server (pinned), but mysql2 only learns it by session tracking, which poolgate does not offer', async (t) => {
    const c = await w.connect();
    const CLIENT_SESSION_TRACK = 0x800000;
    const caps = (c as any).connection._handshakePacket.capabilityFlags as number;
    t.equal(caps & CLIENT_SESSION_TRACK, 0, 'no session tracking offered');
    await c.query('SET character_set_client = koi8r');
    const [[cs]] = (await c.query('SELECT @@character_set_client AS cs')) as any;
    t.equal(cs.cs, 'koi8r', 'the session keeps the change (the client is pinned)');
    await c.end();
  });

  t.test("known difference: poolgate announces a MySQL version while MariaDB's own messages name MariaDB (mysql2's regression #433)", async (t) => {
    const c = await w.connect();
    t.equal((c as any).connection._handshakePacket.serverVersion, '8.0.36-poolgate');
    await t.rejects(c.query('SELECT * FROM `broken'), { errno: 1064, message: /your MariaDB server version/ }, 'the server\'s text, forwarded unchanged');
    await c.end();
  });
}
