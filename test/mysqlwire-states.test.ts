// Issue 30, "the listeners as state machines" (MySQL): a packet that is not legal in the state the session is
// in is answered with an ERR that says what the session was waiting for (session-states.ts), the session is
// closed, and whatever it held comes back: the governor slot, and the server connection (reset and idle
// again when it was between statements, cut when the client was mid-command). One raw client per state.
import t, { type Test } from 'tap';
import { randomBytes } from 'node:crypto';
import { needServer } from './helpers/servers.js';
import { wireFixture } from './helpers/mysql-wire.js';
import { sha2Scramble } from '../src/db/mysqlwire/scramble.js';
import { until } from './helpers/until.js';
import { rawSocket, type Framing } from './helpers/raw-socket.js';

const PROTOCOL_41 = 0x200;
const SECURE_CONNECTION = 0x8000;
const PLUGIN_AUTH = 0x80000;
const PLUGIN_AUTH_LENENC = 0x200000;
const LOCAL_FILES = 0x80;

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const { w, listener, governor, direct } = await wireFixture(t, ['CREATE TABLE f (id INT PRIMARY KEY) ENGINE=InnoDB']);
  await w.setPool(2, { adaptive: false, queueTimeoutMs: 20_000 });

  const packet = (seq: number, body: Buffer) => {
    const head = Buffer.alloc(4);
    head.writeUIntLE(body.length, 0, 3);
    head[3] = seq;
    return Buffer.concat([head, body]);
  };
  /** A MySQL packet: a 3-byte length, the sequence id, the payload. */
  const mysqlPacket: Framing<{ seq: number; payload: Buffer }> = (buf) => {
    if (buf.length < 4 || buf.length < 4 + buf.readUIntLE(0, 3)) return null;
    const len = buf.readUIntLE(0, 3);
    return { value: { seq: buf[3]!, payload: buf.subarray(4, 4 + len) }, size: 4 + len };
  };
  const query = (sql: string, seq = 0) => packet(seq, Buffer.concat([Buffer.from([0x03]), Buffer.from(sql)]));

  /** A raw client: reads packets as they come; logs in with the key under `plugin` (or not at all). */
  const raw = async (opts: { login?: boolean; plugin?: string; caps?: number } = {}) => {
    const { socket, next } = rawSocket(w.port);
    /** The next packet's payload; null once the connection is closed. */
    const read = () => next(mysqlPacket);
    const hello = (await read())!.payload;
    const vEnd = hello.indexOf(0, 1);
    const nonce = Buffer.concat([hello.subarray(vEnd + 5, vEnd + 13), hello.subarray(vEnd + 32, vEnd + 44)]);
    if (opts.login !== false) {
      const plugin = opts.plugin ?? 'caching_sha2_password';
      const token = plugin === 'caching_sha2_password' ? sha2Scramble(w.key, nonce) : randomBytes(20);
      const head = Buffer.alloc(32);
      head.writeUInt32LE(PROTOCOL_41 | SECURE_CONNECTION | PLUGIN_AUTH | PLUGIN_AUTH_LENENC | (opts.caps ?? 0), 0);
      head[8] = 45;
      socket.write(packet(1, Buffer.concat([head, Buffer.from(w.sub + '\0'), Buffer.from([token.length]), token, Buffer.from(plugin + '\0')])));
      if (plugin === 'caching_sha2_password') {
        const more = await read();
        if (more!.payload[0] === 0x01) await read(); // fast auth success, then OK
      }
    }
    return { socket, read, nonce };
  };
  const err = (p: { payload: Buffer } | null) => (p && p.payload[0] === 0xff ? { errno: p.payload.readUInt16LE(1), message: p.payload.toString('utf8', 9) } : null);
  const idleServers = () => listener.servers.idleCount(w.poolId);
  /** Nothing held: no slot, no session linked, and MariaDB sees exactly the server connections poolgate holds. */
  const nothingHeld = async (t: Test, what: string) => {
    await until(`${what}: the session gone and its slot back`, () => listener.counts().clients === 0 && governor.state(w.poolId).inFlight === 0 && listener.counts(w.poolId).inTransaction === 0);
    t.pass(`${what}: no slot held, no session linked`);
    await until(`${what}: no server connection leaked`, async () => (await w.processes()) === listener.counts(w.poolId).serverConnections);
    t.pass(`${what}: MariaDB sees exactly the server connections poolgate holds`);
  };

  t.test("state 'handshake': bytes that are no HandshakeResponse", async (t) => {
    const c = await raw({ login: false });
    c.socket.write(Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
    const e = err(await c.read());
    t.equal(e?.errno, 1043, 'ERR 1043 bad handshake');
    t.match(e?.message, /waiting for a HandshakeResponse or an SSLRequest/, `says what was expected: ${e?.message}`);
    t.equal(await c.read(), null, 'and the session is closed');
    await nothingHeld(t, 'handshake');
  });

  t.test("state 'authSwitch': a packet over the login limit instead of the scramble", async (t) => {
    const c = await raw({ plugin: 'mysql_native_password' });
    const sw = await c.read();
    t.equal(sw!.payload[0], 0xfe, 'asked to switch to caching_sha2_password');
    c.socket.write(Buffer.from([0x01, 0x00, 0x01, sw!.seq + 1])); // announces 65,537 bytes
    const e = err(await c.read());
    t.equal(e?.errno, 1043, 'ERR 1043 bad handshake');
    t.match(e?.message, /waiting for the auth switch response/, `says what was expected: ${e?.message}`);
    t.equal(await c.read(), null, 'and the session is closed');
    await nothingHeld(t, 'authSwitch');
  });

  t.test("state 'idle': a command packet whose sequence id is not 0", async (t) => {
    const c = await raw();
    c.socket.write(query('SELECT 1', 3));
    const e = err(await c.read());
    t.equal(e?.errno, 1156, 'ERR 1156 packets out of order');
    t.match(e?.message, /sequence id 3 \(the session was waiting for a command, sequence id 0\)/, `says what was expected: ${e?.message}`);
    t.equal(await c.read(), null, 'and the session is closed');
    await nothingHeld(t, 'idle');
  });

  /** Opens a transaction on `c` and inserts row `id` in it (uncommitted). */
  const insertInTransaction = async (t: Test, c: Awaited<ReturnType<typeof raw>>, id: number) => {
    c.socket.write(query('START TRANSACTION'));
    t.equal((await c.read())!.payload[0], 0x00, 'START TRANSACTION: OK');
    c.socket.write(query(`INSERT INTO f VALUES (${id})`));
    t.equal((await c.read())!.payload[0], 0x00, 'INSERT: OK');
  };

  t.test("state 'idle' inside a transaction: an empty packet; the transaction is rolled back, its connection reset and idle", async (t) => {
    const idleBefore = idleServers();
    const c = await raw();
    await insertInTransaction(t, c, 1);
    t.equal(governor.state(w.poolId).inFlight, 1, 'the transaction holds a slot');
    t.equal(listener.counts(w.poolId).inTransaction, 1, 'and its server connection');
    c.socket.write(packet(0, Buffer.alloc(0)));
    const e = err(await c.read());
    t.equal(e?.errno, 1047, 'ERR 1047');
    t.match(e?.message, /empty command packet \(the session was waiting for a command/, `says what was expected: ${e?.message}`);
    t.equal(await c.read(), null, 'and the session is closed');
    await nothingHeld(t, 'idle in a transaction');
    await until('the server connection reset and idle again', () => idleServers() >= Math.max(1, idleBefore));
    t.same((await direct.query('SELECT id FROM f'))[0], [], 'nothing committed');
  });

  t.test("state 'running': a packet pipelined behind a running command waits for its answer, then is refused", async (t) => {
    const c = await raw();
    c.socket.write(Buffer.concat([query('SELECT SLEEP(0.5) AS s'), query('SELECT 2', 7)]));
    await until('the command runs with its slot', () => governor.state(w.poolId).inFlight === 1);
    const before: number[] = [];
    let e: ReturnType<typeof err> = null;
    for (let p = await c.read(); p; p = await c.read()) {
      e = err(p);
      if (e) break;
      before.push(p.payload[0]!);
    }
    t.ok(before.length >= 4, `the whole result came first (${before.length} packets)`);
    t.equal(e?.errno, 1156, 'then ERR 1156 for the packet out of order');
    t.match(e?.message, /sequence id 7 \(the session was waiting for a command, sequence id 0\)/, `says what was expected: ${e?.message}`);
    t.equal(await c.read(), null, 'and the session is closed');
    await nothingHeld(t, 'running');
  });

  t.test("state 'infile': an oversized packet instead of the file; the statement is cut upstream", async (t) => {
    const c = await raw({ caps: LOCAL_FILES });
    c.socket.write(query(`LOAD DATA LOCAL INFILE 'rows.tsv' INTO TABLE ${w.db}.f`));
    const request = await c.read();
    t.equal(request!.payload[0], 0xfb, 'the server asks for the file');
    t.equal(governor.state(w.poolId).inFlight, 1, 'the statement holds its slot');
    // Split pieces of 16 MiB are joined up to 64 MiB: the fifth piece's header goes over.
    const piece = Buffer.alloc(0xffffff);
    for (let i = 0; i < 4; i++) c.socket.write(Buffer.concat([Buffer.from([0xff, 0xff, 0xff, request!.seq + 1 + i]), piece]));
    c.socket.write(Buffer.from([0xff, 0xff, 0xff, request!.seq + 5]));
    const e = err(await c.read());
    t.equal(e?.errno, 1153, 'ERR 1153 packet too large');
    t.match(e?.message, /waiting for LOCAL INFILE file packets up to the empty one/, `says what was expected: ${e?.message}`);
    t.equal(await c.read(), null, 'and the session is closed');
    await nothingHeld(t, 'infile');
    t.same((await direct.query('SELECT id FROM f'))[0], [], 'nothing loaded');
  });

  t.test("state 'changeUser' inside a transaction: a wrong key; the transaction is rolled back, its connection reset and idle", async (t) => {
    const idleBefore = idleServers();
    const c = await raw();
    await insertInTransaction(t, c, 2);
    c.socket.write(packet(0, Buffer.concat([Buffer.from([0x11]), Buffer.from(w.sub + '\0'), Buffer.from([0])])));
    const sw = await c.read();
    t.equal(sw!.payload[0], 0xfe, 'COM_CHANGE_USER: asked to switch to caching_sha2_password');
    t.equal(governor.state(w.poolId).inFlight, 1, 'the transaction still holds its slot');
    c.socket.write(packet(sw!.seq + 1, randomBytes(32)));
    const e = err(await c.read());
    t.equal(e?.errno, 1045, 'ERR 1045 access denied');
    t.equal(await c.read(), null, 'and the session is closed');
    await nothingHeld(t, 'changeUser');
    await until('the server connection reset and idle again', () => idleServers() >= Math.max(1, idleBefore));
    t.same((await direct.query('SELECT id FROM f'))[0], [], 'nothing committed');
  });

  // Statements on a held connection start at once and end from the server's read (session-link.ts start()):
  // the next pipelined command is read from there, not after a promise settles.
  for (const caps of [0, LOCAL_FILES]) {
    t.test(`pipelined in one write${caps ? ' (a client with CLIENT_LOCAL_FILES)' : ''}: BEGIN, statements, an error and COMMIT answered in order`, async (t) => {
      const c = await raw({ caps });
      const id = caps ? 11 : 10;
      c.socket.write(Buffer.concat([
        query('BEGIN'), query(`INSERT INTO f VALUES (${id})`), query('SELECT * FROM no_such_table'),
        query(`SELECT id FROM f WHERE id = ${id}`), query('COMMIT'),
      ]));
      t.equal((await c.read())!.payload[0], 0x00, 'BEGIN: OK');
      t.equal((await c.read())!.payload[0], 0x00, 'INSERT: OK');
      t.equal(err(await c.read())?.errno, 1146, 'the missing table: its ERR, and the transaction goes on');
      t.equal((await c.read())!.payload[0], 1, 'SELECT: one column');
      const result: number[] = [];
      for (let i = 0; i < 4; i++) result.push((await c.read())!.payload[0]!);
      t.same(result, [0x03, 0xfe, 0x02, 0xfe], 'its column, EOF, the row written inside the transaction, EOF');
      t.equal((await c.read())!.payload[0], 0x00, 'COMMIT: OK');
      t.same((await direct.query(`SELECT id FROM f WHERE id = ${id}`))[0], [{ id }], 'the row is committed');
      await until('the slot comes back after COMMIT', () => governor.state(w.poolId).inFlight === 0 && listener.counts(w.poolId).inTransaction === 0);
      c.socket.end();
      await nothingHeld(t, 'pipelined');
    });
  }
}
