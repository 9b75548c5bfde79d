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
    const select = 'SELECT id, JSON_EXTRACT(doc, ?) AS tag, JSON_LENGTH(doc) AS n FROM docs ORDER BY id';
    const [rows] = (await c.execute(select, ['$.tags[1]'])) as any;
    // JSON_EXTRACT's result is JSON to MariaDB's extended metadata: mysql2 parses '"b"'.
    t.same(rows, [{ id: 1, tag: 'b', n: 1 }, { id: 2, tag: null, n: 2 }], 'the documents were stored as sent');
    t.same(rows, (await direct.execute(select, ['$.tags[1]']))[0], 'read as directly');
    await c.end();
  });

  // Classes of failures in mysql2's own integration suite through poolgate (docs/mysqlwire.md,
  // "mysql2's integration suite"), reproduced here since CI cannot fetch it.
  t.test('a MariaDB JSON column reaches mysql2 parsed, as directly (the greeting offers MariaDB extended metadata)', async (t) => {
    // MariaDB stores JSON as LONGTEXT and marks it only in extended column metadata (format "json"), which
    // mysql2 asks for only when the greeting offers MARIADB_CLIENT_EXTENDED_METADATA.
    await direct.query('CREATE TABLE IF NOT EXISTS jdocs (id INT PRIMARY KEY, doc JSON, note LONGTEXT)');
    await direct.query(`REPLACE INTO jdocs VALUES (1, '{"a":1}', '{"b":2}')`);
    const [[viaDirect]] = (await direct.query('SELECT doc, note FROM jdocs WHERE id = 1')) as any;
    t.same(viaDirect, { doc: { a: 1 }, note: '{"b":2}' }, 'directly: the JSON column parsed, the LONGTEXT one text');
    const c = await w.connect();
    t.ok((c as any).connection._mariadbExtendedMetadata, 'mysql2 negotiated extended metadata with poolgate');
    const [[viaPoolgate], fields] = (await c.query('SELECT doc, note FROM jdocs WHERE id = 1')) as any;
    t.same(viaPoolgate, viaDirect, 'through poolgate: the same');
    t.equal(fields[0].extendedFormat, 'json', 'the column definition carries the extended metadata');
    // Prepared statements (binary protocol) and a column definition through a prepare answer too.
    const [[viaExecute]] = (await c.execute('SELECT doc, note FROM jdocs WHERE id = ?', [1])) as any;
    t.same(viaExecute, viaDirect, 'execute through poolgate: the same');
    // A statement and its pool's other connections keep working after the first (the variant is per connection).
    const c2 = await w.connect();
    const [[again]] = (await c2.query('SELECT doc FROM jdocs WHERE id = 1')) as any;
    t.same(again.doc, { a: 1 });
    await c2.end();
    await c.end();
  });

  t.test("the greeting announces the pool's server version; VERSION() and the server's error texts are its own (mysql2's regression #433)", async (t) => {
    const c = await w.connect();
    const announced = (c as any).connection._handshakePacket.serverVersion as string;
    const server = (direct as any).connection._handshakePacket.serverVersion as string;
    t.match(server, /MariaDB/);
    t.equal(announced, server, 'the version MariaDB itself announces');
    const [[v]] = (await c.query('SELECT VERSION() AS v')) as any;
    const [[vd]] = (await direct.query('SELECT VERSION() AS v')) as any;
    t.equal(v.v, vd.v, 'VERSION() is the server\'s');
    await t.rejects(c.query('SELECT * FROM `broken'), { errno: 1064, message: /your MariaDB server version/ }, 'the server\'s text, forwarded unchanged');
    await c.end();
  });

  t.test('SET character_set_client reaches mysql2 by session tracking, as directly (the client stays pinned to that session)', async (t) => {
    // mysql2 changes the encoding it sends in only on a session-tracking notice (mysql2's test-track-encodings).
    const text = 'привет, мир';
    const c = await w.connect();
    const CLIENT_SESSION_TRACK = 0x800000;
    t.not((c as any).connection._handshakePacket.capabilityFlags & CLIENT_SESSION_TRACK, 0, 'session tracking offered');
    for (const cs of ['koi8r', 'cp1251']) {
      const [ok] = (await c.query(`SET character_set_client = ${cs}`)) as any;
      t.equal(ok.stateChanges?.systemVariables?.character_set_client, cs, `the server's notice reaches mysql2 (${cs})`);
      const [[row]] = (await c.query('SELECT ? AS result, @@character_set_client AS cs', [text])) as any;
      t.same(row, { result: text, cs }, `the text mysql2 now encodes in ${cs} arrives intact`);
    }
    // A pool connection another client gets afterwards is back to its own character set (the session was reset).
    await c.end();
    const c2 = await w.connect();
    const [[row]] = (await c2.query('SELECT ? AS result, @@character_set_client AS cs', [text])) as any;
    t.same(row, { result: text, cs: 'utf8mb4' });
    await c2.end();
  });
}
