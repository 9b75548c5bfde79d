// The MySQL wire listener against the local MariaDB (issue #6): the mariadb CLI and mysql2 work through
// it unchanged, with the pool named by the user and the pool key as the password; statements and
// prepared statements run on shared server connections; transactions keep theirs; refusals are clean ERRs.
import t from 'tap';
import mysql from 'mysql2/promise';
import { MYSQL, needServer } from './helpers/servers.js';
import { connect } from 'node:net';
import { mariadbCli, wirePool } from './helpers/mysql-wire.js';
import { until } from './helpers/until.js';
import { handshakeResponse, packet, parseGreeting, scramble, serverPackets } from './helpers/mysql-fuzz.js';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const w = await wirePool(t);
  const mysqlWire = w.svc.service.mysql!;
  const cli = (args: string[], input?: string) => mariadbCli(['-h', '127.0.0.1', '-P', String(w.port), '-u', w.sub, `-p${w.key}`, '--batch', ...args], input);
  const direct = await mysql.createConnection({ ...MYSQL, database: w.db });
  t.teardown(() => direct.end());

  t.test('the mariadb CLI runs a statement and a script with a transaction through the listener', async (t) => {
    const one = await cli(['-e', 'SELECT 42 AS answer, DATABASE() AS db, CURRENT_USER() LIKE CONCAT(?, "%") AS x'.replace('?', `'${w.user}'`)]);
    t.equal(one.code, 0, one.stderr);
    t.equal(one.stdout, `answer\tdb\tx\n42\t${w.db}\t1\n`, 'answered by MariaDB as the pool role, in the pool database');
    const script = [
      'CREATE TABLE cli (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB;',
      'START TRANSACTION;',
      "INSERT INTO cli VALUES (1, 'one');",
      "INSERT INTO cli VALUES (2, 'two');",
      'COMMIT;',
      'START TRANSACTION;',
      "INSERT INTO cli VALUES (3, 'three');",
      'ROLLBACK;',
      'SELECT id, v FROM cli ORDER BY id;',
    ].join('\n');
    const run = await cli([w.db], script);
    t.equal(run.code, 0, run.stderr);
    t.equal(run.stdout, 'id\tv\n1\tone\n2\ttwo\n');
    const [rows] = await direct.query('SELECT COUNT(*) AS n FROM cli');
    t.equal(Number((rows as Array<{ n: number }>)[0]!.n), 2, 'committed rows are there, the rolled back one is not');
  });

  t.test('the mariadb CLI: a wrong key, an unknown pool and another database are refused with ERR', async (t) => {
    const bad = await mariadbCli(['-h', '127.0.0.1', '-P', String(w.port), '-u', w.sub, '-pnot-the-key', '-e', 'SELECT 1']);
    t.not(bad.code, 0);
    t.match(bad.stderr, /ERROR 1045 \(28000\).*Access denied/);
    const unknown = await mariadbCli(['-h', '127.0.0.1', '-P', String(w.port), '-u', 'no-such-pool', `-p${w.key}`, '-e', 'SELECT 1']);
    t.match(unknown.stderr, /ERROR 1045 \(28000\)/);
    const otherDb = await cli(['mysql', '-e', 'SELECT 1']);
    t.match(otherDb.stderr, /ERROR 1044 \(42000\)/);
  });

  t.test('mysql2: query, prepared statements over many statements on fewer server connections, ping, end', async (t) => {
    await w.setPool(2, { adaptive: false });
    const setup = await w.connect();
    await setup.query('CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2), at DATETIME NULL) ENGINE=InnoDB');
    await setup.end();
    // 6 clients share max_concurrent 2: every statement lands on one of at most 2 server connections,
    // where each client's prepared statements are prepared again as needed.
    const clients = await Promise.all(Array.from({ length: 6 }, () => w.connect()));
    await Promise.all(
      clients.map(async (c, ci) => {
        for (let i = 0; i < 20; i++) {
          const id = ci * 100 + i;
          await c.execute('INSERT INTO items (id, name, price, at) VALUES (?, ?, ?, ?)', [id, `item ${id} é`, (id / 4).toFixed(2), i % 2 ? null : new Date(Date.UTC(2024, 0, 1, 0, 0, i))]);
          const [rows] = await c.execute('SELECT id, name, price FROM items WHERE id = ?', [id]);
          t.same(rows, [{ id, name: `item ${id} é`, price: (id / 4).toFixed(2) }], `client ${ci} reads its row ${id}`);
        }
      }),
    );
    t.ok(w.svc.service.mysql!.counts(w.poolId).serverConnections <= 2, 'never more server connections than max_concurrent');
    const [count] = await clients[0]!.query('SELECT COUNT(*) AS n FROM items');
    t.same(count, [{ n: 120 }]);
    await clients[1]!.ping();
    for (const c of clients) await c.end();
    t.ok((await w.processes()) <= 2, 'MariaDB sees at most 2 sessions of the role');
  });

  t.test('mysql2: a rolled back transaction keeps its server connection and leaves nothing', async (t) => {
    const c = await w.connect();
    const [[before]] = (await c.query('SELECT COUNT(*) AS n FROM items')) as any;
    await c.beginTransaction();
    const [[id1]] = (await c.query('SELECT CONNECTION_ID() AS id')) as any;
    await c.execute('INSERT INTO items (id, name) VALUES (?, ?)', [9001, 'tx']);
    const [[inTx]] = (await c.query('SELECT COUNT(*) AS n FROM items')) as any;
    const [[id2]] = (await c.query('SELECT CONNECTION_ID() AS id')) as any;
    t.equal(id2.id, id1.id, 'the whole transaction runs on one server connection');
    t.equal(inTx.n, before.n + 1, 'the transaction sees its insert');
    t.equal(w.svc.service.mysql!.counts(w.poolId).inTransaction, 1);
    await c.rollback();
    t.equal(w.svc.service.mysql!.counts(w.poolId).inTransaction, 0, 'released at ROLLBACK');
    const [[after]] = (await c.query('SELECT COUNT(*) AS n FROM items')) as any;
    t.equal(after.n, before.n);
    const [[committed]] = (await direct.query('SELECT COUNT(*) AS n FROM items WHERE id = 9001')) as any;
    t.equal(committed.n, 0);
    await c.end();
  });

  t.test('mysql2: errors from MariaDB pass through and the session goes on', async (t) => {
    const c = await w.connect();
    await t.rejects(c.query('SELECT * FROM no_such_table'), { errno: 1146, sqlState: '42S02' });
    await t.rejects(c.execute('INSERT INTO items (id) VALUES (?)', [0]), { errno: 1062 }, 'duplicate key from a prepared statement');
    await t.rejects(c.prepare('SELEKT nonsense'), { errno: 1064 });
    const [rows] = await c.query('SELECT 1 AS ok');
    t.same(rows, [{ ok: 1 }]);
    // Several result sets in one COM_QUERY when the client asks for multi-statements.
    const m = await w.connect({ multipleStatements: true });
    const [sets] = (await m.query('SELECT 1 AS a; SELECT 2 AS b')) as any;
    t.same(sets, [[{ a: 1 }], [{ b: 2 }]]);
    await m.end();
    // Without it, the server refuses a second statement (the client's injection guard stays).
    await t.rejects(c.query('SELECT 1; SELECT 2'), { errno: 1064 });
    await c.end();
  });

  t.test('large results stream through whole, in text and binary protocol, and the session goes on', async (t) => {
    const c = await w.connect();
    const [rows] = (await c.query("SELECT seq, REPEAT('ab', 5000) AS pad FROM seq_1_to_2000")) as any;
    t.equal(rows.length, 2000, '2000 rows of 10 kB (20 MB) in text protocol');
    t.ok(rows.every((r: { seq: number; pad: string }, i: number) => r.seq === i + 1 && r.pad.length === 10_000), 'every row intact');
    const [bin] = (await c.execute('SELECT seq, REPEAT(?, 5000) AS pad FROM seq_1_to_2000', ['cd'])) as any;
    t.equal(bin.length, 2000, 'and in binary protocol (prepared)');
    t.equal(bin[1999].pad.slice(0, 4), 'cdcd');
    const [after] = await c.query('SELECT 9 AS nine');
    t.same(after, [{ nine: 9 }], 'the answer ended exactly where the scanner said');
    await c.end();
  });

  t.test('LOAD DATA LOCAL INFILE from a client without local infile is refused (test/mysqlwire-local-infile.test.ts loads files)', async (t) => {
    const r = await cli(['--local-infile=0', w.db, '-e', "LOAD DATA LOCAL INFILE '/etc/hostname' INTO TABLE cli"]);
    t.not(r.code, 0);
    t.match(r.stderr, /ERROR (1148|4166|2068)/);
    const [[n]] = (await direct.query('SELECT COUNT(*) AS n FROM cli')) as any;
    t.equal(n.n, 2, 'nothing loaded');
  });

  t.test('mysql2: wrong key, unknown pool, expired key, another database are refused; a read key connects', async (t) => {
    await t.rejects(w.connect({ password: 'wrong' }), { errno: 1045, sqlState: '28000' });
    await t.rejects(w.connect({ user: 'nosuchpool' }), { errno: 1045 });
    await t.rejects(w.connect({ database: 'mysql' }), { errno: 1044, sqlState: '42000' });
    const read = (await w.svc.api('POST', `/api/v1/pools/${w.sub}/keys`, { token: w.token, body: { label: 'r', access: 'read' } })).body.data.key;
    await w.svc.service.dataplane!.snapshots.reload();
    // Spec (key access 3): on a database pool both key kinds connect as the pool's role.
    const reader = await w.connect({ password: read });
    t.same((await reader.query('SELECT 7 AS seven'))[0], [{ seven: 7 }], 'a read key connects as the pool role');
    await reader.end();
    const minted = (await w.svc.api('POST', `/api/v1/pools/${w.sub}/keys`, { token: w.token, body: { label: 'soon' } })).body.data;
    await w.svc.service.dataplane!.snapshots.reload();
    const live = await w.connect({ password: minted.key });
    await w.svc.service.sql.query("UPDATE pool_keys SET expires_at = now() - interval '1 second' WHERE id = $1", [minted.id]);
    await w.svc.service.dataplane!.snapshots.reload();
    await t.rejects(w.connect({ password: minted.key }), { errno: 1045 }, 'an expired key cannot log in');
    await t.rejects(live.query('SELECT 1'), { errno: 1045 }, 'a session of an expired key is refused at its next statement');
    live.destroy();
    // A revocation arrives as a key point update (no reload, the snapshot object stays): the next statement is refused.
    const doomed = (await w.svc.api('POST', `/api/v1/pools/${w.sub}/keys`, { token: w.token, body: { label: 'doomed' } })).body.data;
    await w.svc.service.dataplane!.snapshots.reload();
    const session = await w.connect({ password: doomed.key });
    t.same((await session.query('SELECT 1 AS one'))[0], [{ one: 1 }]);
    t.equal((await w.svc.api('DELETE', `/api/v1/pools/${w.sub}/keys/${doomed.id}`, { token: w.token })).status, 200);
    const revokedAt = Date.now();
    let refused: { errno?: number } | null = null;
    while (refused === null && Date.now() - revokedAt < 3000) {
      refused = await session.query('SELECT 1').then(() => null, (e: { errno?: number }) => e);
      if (refused === null) await new Promise((resolve) => setTimeout(resolve, 50));
    }
    t.equal(refused?.errno, 1045, 'a revoked key is refused at its next statement');
    session.destroy();
  });

  t.test("a client answering under another plugin, even with nothing (libmariadb's dummy_fallback_auth), is asked to switch to caching_sha2_password", async (t) => {
    // sysbench's threads connecting at once: some libmariadb connections have not loaded the
    // caching_sha2_password plugin yet and send an empty dummy_fallback_auth answer. Taken as an empty
    // password, they were refused; MySQL asks them to switch, and by then the plugin is there.
    const s = connect({ host: '127.0.0.1', port: w.port });
    s.on('error', () => {});
    let out = Buffer.alloc(0);
    const waitPackets = async (n: number) => {
      const end = Date.now() + 5000;
      while (serverPackets(out).packets.length < n && Date.now() < end) await new Promise((r) => setTimeout(r, 10));
      return serverPackets(out).packets;
    };
    s.on('data', (c: Buffer) => (out = Buffer.concat([out, c])));
    const greeting = parseGreeting((await waitPackets(1))[0]!.payload)!;
    t.equal(greeting.plugin, 'caching_sha2_password');
    s.write(packet(handshakeResponse(w.sub, Buffer.alloc(0), 'dummy_fallback_auth'), 1));
    const sw = (await waitPackets(2))[1]!;
    t.equal(sw.payload[0], 0xfe, 'an AuthSwitchRequest');
    t.match(sw.payload.toString('latin1'), /^\xfecaching_sha2_password\0/, 'to caching_sha2_password');
    s.write(packet(scramble('caching_sha2_password', w.key, greeting.nonce), sw.seq + 1));
    const done = await waitPackets(4);
    t.same([...done[2]!.payload], [0x01, 0x03], 'fast auth success');
    t.equal(done[3]!.payload[0], 0x00, 'then OK: logged in');
    s.destroy();
  });

  t.test('commands: USE of the pool database, COM_CHANGE_USER refused, COM_RESET_CONNECTION', async (t) => {
    const c = await w.connect();
    await c.query(`USE ${w.db}`);
    await t.rejects(c.changeUser({ user: 'root' }), { errno: 1235 });
    const again = await w.connect();
    await again.query('SELECT 1');
    await again.reset();
    const [rows] = await again.query('SELECT 2 AS two');
    t.same(rows, [{ two: 2 }]);
    await again.end();
    c.destroy();
  });

  t.test('session state does not leak to the next client of a server connection (USE, SET, temporary tables)', async (t) => {
    await w.setPool(1, { adaptive: false });
    // Connections opened under max_concurrent 2 are closed as they come back: one statement leaves one.
    const warm = await w.connect();
    await warm.query('SELECT 1');
    await warm.end();
    const a = await w.connect();
    await a.query('USE information_schema');
    await a.query("SET @secret = 'from a', SESSION sql_mode = 'ANSI_QUOTES'");
    await a.query(`CREATE TEMPORARY TABLE ${w.db}.tmp_a (x INT)`);
    await a.query("SELECT 'selected by a' INTO @picked");
    await a.query("SELECT GET_LOCK('lock_of_a', 0)");
    const [[aid]] = (await a.query('SELECT CONNECTION_ID() AS id')) as any;
    await a.end();
    const b = await w.connect();
    const [[seen]] = (await b.query('SELECT DATABASE() AS d, @secret AS s, @@SESSION.sql_mode LIKE "%ANSI_QUOTES%" AS q, CONNECTION_ID() AS id')) as any;
    t.equal(seen.id, aid.id, 'the same server connection (max_concurrent 1)');
    t.equal(seen.d, w.db, "the pool's database again");
    t.equal(seen.s, null, 'no user variable of the previous client');
    t.equal(Number(seen.q), 0, 'no session variable of the previous client');
    await t.rejects(b.query('SELECT * FROM tmp_a'), { errno: 1146 }, 'no temporary table of the previous client');
    const [[more]] = (await b.query("SELECT @picked AS p, IS_USED_LOCK('lock_of_a') AS l")) as any;
    t.equal(more.p, null, 'no variable set by SELECT … INTO of the previous client');
    t.equal(more.l, null, 'no named lock of the previous client');
    // Inside a transaction a client's own session state holds from statement to statement.
    await b.beginTransaction();
    await b.query("SET @mine = 'kept'");
    const [[mine]] = (await b.query('SELECT @mine AS m')) as any;
    t.equal(mine.m, 'kept');
    await b.commit();
    await b.end();
    // The same through prepared statements: MariaDB runs USE and SET prepared, with COM_STMT_EXECUTE.
    const c = await w.connect();
    await c.execute('USE information_schema');
    await c.execute("SET @prepared = 'from c'");
    const [[cid]] = (await c.query('SELECT CONNECTION_ID() AS id')) as any;
    await c.end();
    const d = await w.connect();
    const [[after]] = (await d.query('SELECT DATABASE() AS d, @prepared AS p, CONNECTION_ID() AS id')) as any;
    t.equal(after.id, cid.id, 'the same server connection again');
    t.equal(after.d, w.db, "the pool's database after a prepared USE");
    t.equal(after.p, null, 'no variable set by a prepared SET');
    await d.end();
    await w.setPool(2, { adaptive: false });
  });

  t.test('the IP allowlist applies at login; an HTTP-only policy (HMAC) refuses wire clients', async (t) => {
    await w.setPool(2, { adaptive: false, ipAllowlist: ['10.0.0.0/8'] });
    await t.rejects(w.connect(), { errno: 1130 }, 'a loopback client outside the allowlist');
    await w.setPool(2, { adaptive: false, ipAllowlist: ['127.0.0.0/8'] });
    const inside = await w.connect();
    t.same((await inside.query('SELECT 1 AS one'))[0], [{ one: 1 }], 'inside the allowlist');
    await inside.end();
    await w.setPool(2, { adaptive: false, originSigning: true });
    await t.rejects(w.connect(), { errno: 1045, message: /HMAC/ });
    await w.setPool(2, { adaptive: false });
  });

  t.test('wire statements are counted like pool requests (Prometheus)', async (t) => {
    const admitted = async () => {
      const text = await (await fetch(`${w.svc.metricsUrl}/metrics`)).text();
      const line = text.split('\n').find((l) => l.startsWith('poolgate_pool_admitted_total') && l.includes(`pool="${w.sub}"`));
      return line ? Number(line.split(' ').pop()) : 0;
    };
    const before = await admitted();
    const c = await w.connect();
    for (let i = 0; i < 3; i++) await c.query('SELECT 1');
    await c.beginTransaction();
    await c.query('SELECT 1');
    await c.query('SELECT 2');
    await c.commit();
    await c.end();
    t.equal((await admitted()) - before, 4, 'three statements and one transaction');
  });

  t.test('no slot held and no server connection leaked at the end', async (t) => {
    // The last clients' ends settle after their end() returned: wait for that state, within the ceiling.
    await until('the slots released', () => w.svc.service.dataplane!.governor.state(w.poolId).inFlight === 0);
    const state = w.svc.service.dataplane!.governor.state(w.poolId);
    t.equal(state.inFlight, 0, 'no slot held');
    const counts = mysqlWire.counts(w.poolId);
    t.equal(counts.inTransaction, 0);
    t.ok(counts.serverConnections <= 2, `server connections within max_concurrent (${counts.serverConnections})`);
    t.equal(await w.processes(), counts.serverConnections, 'MariaDB sees exactly the connections poolgate holds');
  });
}
