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
}
