// The MySQL wire listener under load and faults, against the local MariaDB: max_concurrent holds under
// 50 clients, a client killed inside a transaction commits nothing and its server connection is reset
// and reused, connections killed upstream give that client a clean error and the next statement works,
// bad bytes get ERR packets; no slot and no server connection is leaked.
import t from 'tap';
import { connect, type Socket } from 'node:net';
import { spawn } from 'node:child_process';
import { needServer } from './helpers/servers.js';
import { mariadbCli, wireFixture } from './helpers/mysql-wire.js';
import { sha2Scramble } from '../src/db/mysqlwire/scramble.js';
import { sleep, until } from './helpers/until.js';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const { w, listener, governor, direct } = await wireFixture(t, ['CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB']);

  t.test('max_concurrent 3 holds under 50 concurrent clients: never more statements running upstream', async (t) => {
    await w.setPool(3, { adaptive: false, queueLength: 100, queueTimeoutMs: 120_000 });
    const clients = await Promise.all(Array.from({ length: 50 }, () => w.connect()));
    let maxSeen = 0;
    let maxSlots = 0;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        maxSeen = Math.max(maxSeen, await w.processes('SLEEP(0.2'));
        maxSlots = Math.max(maxSlots, governor.state(w.poolId).inFlight);
        await sleep(20);
      }
    })();
    const answers = await Promise.all(clients.map((c, i) => c.query(`SELECT SLEEP(0.2) AS s, ${i} AS i`)));
    sampling = false;
    await sampler;
    t.same(answers.map(([rows]) => (rows as Array<{ i: number }>)[0]!.i), Array.from({ length: 50 }, (_, i) => i), 'every client got its own answer');
    t.ok(maxSeen >= 1 && maxSeen <= 3, `statements running upstream at once: ${maxSeen} (limit 3)`);
    t.ok(maxSlots <= 3, `slots held at once: ${maxSlots}`);
    t.ok(listener.counts(w.poolId).serverConnections <= 3, 'server connections within max_concurrent');
    await Promise.all(clients.map((c) => c.end()));
  });

  t.test('a full queue is a clean ERR 1040 to that statement only', async (t) => {
    await w.setPool(1, { adaptive: false, queueLength: 0, queueTimeoutMs: 0 });
    const holder = await w.connect();
    await holder.beginTransaction();
    await holder.query('SELECT 1');
    const other = await w.connect();
    await t.rejects(other.query('SELECT 1'), { errno: 1040, sqlState: '08004' });
    await holder.commit();
    const [rows] = await other.query('SELECT 2 AS two');
    t.same(rows, [{ two: 2 }], 'the refused client goes on once the slot is free');
    await holder.end();
    await other.end();
  });

  t.test('a client killed inside a transaction: nothing committed, its server connection reset and reused', async (t) => {
    await w.setPool(1, { adaptive: false, queueLength: 100, queueTimeoutMs: 30_000 });
    const child = spawn('mariadb', ['-h', '127.0.0.1', '-P', String(w.port), '-u', w.sub, `-p${w.key}`, '--batch', '--unbuffered', '--skip-column-names', w.db], { stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stdin.write('START TRANSACTION;\nINSERT INTO t VALUES (1);\nSELECT CONCAT("ready ", CONNECTION_ID());\n');
    t.teardown(() => void child.kill('SIGKILL'));
    await until('the CLI inside its transaction', () => /ready \d+/.test(out));
    const threadId = Number(/ready (\d+)/.exec(out)![1]);
    t.equal(listener.counts(w.poolId).inTransaction, 1);
    child.kill('SIGKILL');
    await until('the transaction released', () => listener.counts(w.poolId).inTransaction === 0 && governor.state(w.poolId).inFlight === 0);
    const [[row]] = (await direct.query('SELECT COUNT(*) AS n FROM t')) as any;
    t.equal(row.n, 0, 'the insert was never committed');
    // The same kind of client (the CLI) lands on the same server connection: max_concurrent is 1.
    const next = await mariadbCli(['-h', '127.0.0.1', '-P', String(w.port), '-u', w.sub, `-p${w.key}`, '--batch', '--skip-column-names', w.db, '-e', 'SELECT CONNECTION_ID(), @@in_transaction; INSERT INTO t VALUES (2);']);
    t.equal(next.code, 0, next.stderr);
    t.equal(next.stdout, `${threadId}\t0\n`, 'the same server connection serves the next client, outside any transaction');
    const [[n]] = (await direct.query('SELECT COUNT(*) AS n FROM t')) as any;
    t.equal(n.n, 1, 'and its autocommitted insert is there');
  });

  t.test('connections killed upstream: a clean error to that client, the next statement works', async (t) => {
    await w.setPool(2, { adaptive: false, queueLength: 100, queueTimeoutMs: 30_000 });
    const c = await w.connect();
    // Handled at once: the ERR may come before the KILL's own answer.
    const running = c.query('SELECT SLEEP(30)').then(() => null, (e: { errno?: number; fatal?: boolean }) => e);
    await until('the SLEEP upstream', async () => (await w.processes('SLEEP(30)')) === 1);
    const [procs] = (await w.root.query(`SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ? AND INFO LIKE '%SLEEP(30)%'`, [w.user])) as any;
    await w.root.query(`KILL ${procs[0].ID}`);
    const err = await running;
    t.ok(err, 'the statement fails');
    t.ok(err && !err.fatal, `a protocol-level ERR (errno ${err?.errno}), the session stays open`);
    const [rows] = await c.query('SELECT 3 AS three');
    t.same(rows, [{ three: 3 }], 'the next statement works');

    // Inside a transaction: the transaction is gone, the client hears so, and goes on.
    await c.beginTransaction();
    await c.query('INSERT INTO t VALUES (10)');
    const [[me]] = (await c.query('SELECT CONNECTION_ID() AS id')) as any;
    const open = listener.counts(w.poolId).serverConnections;
    await w.root.query(`KILL ${me.id}`);
    // The positive signal that the listener saw its server connection end: it holds one fewer.
    await until('the killed connection noticed', () => listener.counts(w.poolId).serverConnections < open);
    await t.rejects(c.query('INSERT INTO t VALUES (11)'), { errno: 1317, sqlState: '70100', message: /rolled back/ }, 'the transaction is reported lost');
    t.equal(listener.counts(w.poolId).inTransaction, 0);
    const [[n]] = (await direct.query('SELECT COUNT(*) AS n FROM t WHERE id >= 10')) as any;
    t.equal(n.n, 0, 'nothing of the killed transaction was committed');
    const [again] = await c.query('SELECT 4 AS four');
    t.same(again, [{ four: 4 }]);

    // Every idle server connection killed (as on a database restart): the next statements open new ones.
    const [idle] = (await w.root.query('SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ?', [w.user])) as any;
    for (const p of idle) await w.root.query(`KILL ${p.ID}`).catch(() => {});
    // The positive signal that the listener saw them end: it holds no server connection.
    await until('the killed connections noticed', () => listener.counts(w.poolId).serverConnections === 0);
    const [after] = await c.query('SELECT 5 AS five');
    t.same(after, [{ five: 5 }]);
    await c.end();
  });

  t.test('a transaction idle past the pool request timeout is rolled back and its slot freed', async (t) => {
    await w.setPool(2, { adaptive: false, queueLength: 100, queueTimeoutMs: 30_000, requestTimeoutMs: 500 });
    const c = await w.connect();
    c.on('error', () => {});
    await c.beginTransaction();
    await c.query('INSERT INTO t VALUES (20)');
    t.equal(governor.state(w.poolId).inFlight, 1, 'the transaction holds a slot');
    await until('the idle transaction ended', () => governor.state(w.poolId).inFlight === 0 && listener.counts(w.poolId).inTransaction === 0);
    await t.rejects(c.query('SELECT 1'), 'the session is closed');
    const [[n]] = (await direct.query('SELECT COUNT(*) AS n FROM t WHERE id = 20')) as any;
    t.equal(n.n, 0, 'its insert was rolled back');
    await w.setPool(2, { adaptive: false, queueLength: 100, queueTimeoutMs: 30_000 });
  });

  t.test('a statement past the pool request timeout is killed upstream; the slot is freed and the session goes on', async (t) => {
    await w.setPool(2, { adaptive: false, queueLength: 100, queueTimeoutMs: 30_000, requestTimeoutMs: 1000 });
    const c = await w.connect();
    const started = Date.now();
    // MariaDB ends an interrupted SLEEP with the value 1 (or ERR 1317): either way long before 30 s.
    const r = await c.query('SELECT SLEEP(30) AS s').then(([rows]) => (rows as Array<{ s: number }>)[0]!.s, (e: { errno?: number }) => e.errno);
    t.ok(r === 1 || r === 1317, `interrupted (${r})`);
    t.ok(Date.now() - started < 20_000, 'well before the statement would have ended');
    await until('the slot freed', () => governor.state(w.poolId).inFlight === 0);
    const [rows] = await c.query('SELECT 11 AS eleven');
    t.same(rows, [{ eleven: 11 }], 'the next statement works');
    await c.end();
    await w.setPool(2, { adaptive: false, queueLength: 100, queueTimeoutMs: 30_000 });
    await until('the killed connection gone upstream', async () => (await w.processes()) === listener.counts(w.poolId).serverConnections);
  });

  /** A raw client: reads the handshake, logs in with the key, then sends what the test wants. */
  const raw = async (login: boolean): Promise<{ socket: Socket; read(): Promise<Buffer> }> => {
    const socket = connect({ host: '127.0.0.1', port: w.port });
    let buf = Buffer.alloc(0);
    let closed = false;
    const waiters: Array<() => void> = [];
    socket.on('data', (c: Buffer) => {
      buf = Buffer.concat([buf, c]);
      waiters.splice(0).forEach((f) => f());
    });
    socket.on('close', () => {
      closed = true;
      waiters.splice(0).forEach((f) => f());
    });
    socket.on('error', () => {});
    const read = async (): Promise<Buffer> => {
      for (;;) {
        if (buf.length >= 4 && buf.length >= 4 + buf.readUIntLE(0, 3)) {
          const p = buf.subarray(0, 4 + buf.readUIntLE(0, 3));
          buf = buf.subarray(p.length);
          return p;
        }
        if (closed) return Buffer.alloc(0);
        await new Promise<void>((r) => waiters.push(r));
      }
    };
    const hello = await read();
    if (login) {
      const p = hello.subarray(4);
      const vEnd = p.indexOf(0, 1);
      const nonce = Buffer.concat([p.subarray(vEnd + 5, vEnd + 13), p.subarray(vEnd + 32, vEnd + 44)]);
      const token = sha2Scramble(w.key, nonce);
      const head = Buffer.alloc(32);
      head.writeUInt32LE(0x200 | 0x8000 | 0x80000 | 0x200000, 0);
      head[8] = 45;
      const body = Buffer.concat([head, Buffer.from(w.sub + '\0'), Buffer.from([token.length]), token, Buffer.from('caching_sha2_password\0')]);
      const pkt = Buffer.alloc(4);
      pkt.writeUIntLE(body.length, 0, 3);
      pkt[3] = 1;
      socket.write(Buffer.concat([pkt, body]));
      const more = await read();
      if (more[4] === 0x01) await read(); // fast auth success, then OK
    }
    return { socket, read };
  };
  const errno = (p: Buffer) => (p.length > 6 && p[4] === 0xff ? p.readUInt16LE(5) : null);

  t.test('bad bytes: garbage, truncated and oversized frames get an ERR or a close, never a crash', async (t) => {
    const g = await raw(false);
    g.socket.write(Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
    t.equal(errno(await g.read()), 1043, 'garbage instead of a handshake: ERR 1043 bad handshake');
    const big = await raw(false);
    big.socket.write(Buffer.from([0xff, 0xff, 0xff, 1]));
    t.equal(errno(await big.read()), 1043, 'a 16 MiB packet announced at login: ERR 1043');
    const cut = await raw(false);
    cut.socket.end(Buffer.from([100, 0, 0, 1, 1, 2, 3]));
    t.equal((await cut.read()).length, 0, 'a truncated frame and a vanished client: closed');

    const a = await raw(true);
    // Split pieces of 16 MiB are joined up to 64 MiB: the fifth piece's header goes over.
    const piece = Buffer.alloc(0xffffff);
    for (let i = 0; i < 4; i++) a.socket.write(Buffer.concat([Buffer.from([0xff, 0xff, 0xff, i]), piece]));
    a.socket.write(Buffer.from([0xff, 0xff, 0xff, 4]));
    t.equal(errno(await a.read()), 1153, 'an oversized (split) command: ERR 1153');
    const b = await raw(true);
    b.socket.write(Buffer.from([1, 0, 0, 0, 0x12]));
    t.equal(errno(await b.read()), 1235, 'COM_BINLOG_DUMP refused with ERR 1235');
    b.socket.write(Buffer.from([1, 0, 0, 0, 0x77]));
    t.equal(errno(await b.read()), 1047, 'an unknown command byte: ERR 1047');
    b.socket.write(Buffer.from([5, 0, 0, 0, 0x17, 9, 9, 9, 9]));
    t.equal(errno(await b.read()), 1243, 'execute of a statement never prepared: ERR 1243');
    b.socket.write(Buffer.from([1, 0, 0, 0, 0x0e]));
    t.equal((await b.read())[4], 0x00, 'and the session still answers COM_PING');
    b.socket.destroy();
    const c = await w.connect();
    const [rows] = await c.query('SELECT 6 AS six');
    t.same(rows, [{ six: 6 }], 'the listener serves on');
    await c.end();
  });

  t.test('a command packet out of sequence is refused with ERR 1156 and its open transaction rolled back', async (t) => {
    const q = (sql: string, seq = 0) => {
      const body = Buffer.concat([Buffer.from([0x03]), Buffer.from(sql)]);
      const head = Buffer.alloc(4);
      head.writeUIntLE(body.length, 0, 3);
      head[3] = seq;
      return Buffer.concat([head, body]);
    };
    const c = await raw(true);
    c.socket.write(q('START TRANSACTION'));
    t.equal((await c.read())[4], 0x00, 'START TRANSACTION answered OK');
    c.socket.write(q('INSERT INTO t VALUES (1156)'));
    t.equal((await c.read())[4], 0x00, 'INSERT answered OK inside the transaction');
    // A START TRANSACTION would implicitly commit the open transaction if it were run.
    c.socket.write(q('START TRANSACTION', 3));
    t.equal(errno(await c.read()), 1156, 'ERR 1156 packets out of order');
    t.equal((await c.read()).length, 0, 'and the session is closed');
    await until('the session gone', () => listener.counts(w.poolId).inTransaction === 0);
    const [rows] = (await direct.query('SELECT id FROM t WHERE id = 1156')) as any;
    t.same(rows, [], 'the open transaction was rolled back, not committed');
  });

  t.test('no slot held and no server connection leaked at the end', async (t) => {
    await until('clients gone', () => listener.counts().clients === 0);
    t.equal(governor.state(w.poolId).inFlight, 0, 'no slot held');
    t.equal(listener.counts(w.poolId).inTransaction, 0);
    const open = listener.counts(w.poolId).serverConnections;
    t.ok(open <= 2, `server connections within max_concurrent (${open})`);
    await until('MariaDB to see the same sessions', async () => (await w.processes()) === listener.counts(w.poolId).serverConnections);
    t.pass('MariaDB sees exactly the connections poolgate holds');
  });
}
