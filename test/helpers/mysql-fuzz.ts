// MySQL client-protocol fuzz packets (handshake, auth, COM_QUERY, COM_STMT_* with bad ids, odd commands)
// and a checker of everything the server answers, for test/mysqlwire-fuzz.test.ts.
import { createHash } from 'node:crypto';
import { mutateBytes, mutateText, type Protocol, type Rng, type ServerStream, type WireConn } from './wire-fuzz.js';

export interface MysqlTarget {
  /** The login user name (the pool's subdomain for poolgate). */
  user: string;
  password: string;
  database?: string;
  /** A table no fuzz connection may leave a committed row in. */
  uncommittedTable: string;
}

/** One packet: 3-byte length, sequence id, payload; `length` may lie. */
export function packet(payload: Buffer, seq = 0, length?: number): Buffer {
  const head = Buffer.alloc(4);
  head.writeUIntLE((length ?? payload.length) & 0xffffff, 0, 3);
  head[3] = seq & 0xff;
  return Buffer.concat([head, payload]);
}
const u32 = (n: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n >>> 0);
  return b;
};
const u16 = (n: number) => {
  const b = Buffer.alloc(2);
  b.writeUInt16LE(n & 0xffff);
  return b;
};
const cstr = (s: string) => Buffer.from(s + '\0');
const command = (code: number, body: Buffer | string = Buffer.alloc(0)) => packet(Buffer.concat([Buffer.from([code]), typeof body === 'string' ? Buffer.from(body) : body]));
export const comQuery = (sql: string) => command(0x03, sql);

const CAP = {
  LONG_PASSWORD: 0x1, LONG_FLAG: 0x4, CONNECT_WITH_DB: 0x8, PROTOCOL_41: 0x200, SSL: 0x800, TRANSACTIONS: 0x2000,
  SECURE_CONNECTION: 0x8000, MULTI_STATEMENTS: 0x10000, MULTI_RESULTS: 0x20000, PLUGIN_AUTH: 0x80000, CONNECT_ATTRS: 0x100000,
  PLUGIN_AUTH_LENENC: 0x200000,
};
const CLIENT_CAPS = CAP.LONG_PASSWORD | CAP.LONG_FLAG | CAP.PROTOCOL_41 | CAP.TRANSACTIONS | CAP.SECURE_CONNECTION | CAP.MULTI_RESULTS | CAP.PLUGIN_AUTH | CAP.PLUGIN_AUTH_LENENC;

export interface Greeting {
  nonce: Buffer;
  plugin: string;
}

/** The server's initial handshake (protocol 10), or null when the packet is not one. */
export function parseGreeting(p: Buffer): Greeting | null {
  if (p[0] !== 10) return null;
  let i = p.indexOf(0, 1);
  if (i < 0) return null;
  i += 1 + 4; // NUL, connection id
  const part1 = p.subarray(i, i + 8);
  i += 8 + 1 + 2 + 1 + 2 + 2;
  const authLen = p[i] ?? 0;
  i += 1 + 10;
  const len2 = Math.max(13, authLen - 8);
  const part2 = p.subarray(i, i + len2 - 1);
  i += len2;
  const end = p.indexOf(0, i);
  const plugin = p.subarray(i, end < 0 ? p.length : end).toString();
  return { nonce: Buffer.concat([part1, part2]), plugin: plugin || 'mysql_native_password' };
}

const sha1 = (...b: Buffer[]) => b.reduce((h, x) => h.update(x), createHash('sha1')).digest();
const sha256 = (...b: Buffer[]) => b.reduce((h, x) => h.update(x), createHash('sha256')).digest();
const xor = (a: Buffer, b: Buffer) => Buffer.from(a.map((x, i) => x ^ b[i]!));

/** The auth response a client sends for `plugin` (native SHA-1 scramble, caching_sha2 SHA-256 scramble, or cleartext). */
export function scramble(plugin: string, password: string, nonce: Buffer): Buffer {
  if (!password) return Buffer.alloc(0);
  const pw = Buffer.from(password);
  const n = nonce.subarray(0, 20);
  if (plugin === 'caching_sha2_password') {
    const h1 = sha256(pw);
    return xor(h1, sha256(sha256(h1), n));
  }
  if (plugin === 'mysql_clear_password') return Buffer.concat([pw, Buffer.from([0])]);
  const h1 = sha1(pw);
  return xor(h1, sha1(n, sha1(h1)));
}

export function handshakeResponse(user: string, auth: Buffer, plugin: string, database?: string, caps = CLIENT_CAPS): Buffer {
  const flags = caps | (database ? CAP.CONNECT_WITH_DB : 0);
  return Buffer.concat([
    u32(flags), u32(1 << 24), Buffer.from([45]), Buffer.alloc(23), cstr(user),
    Buffer.from([auth.length]), auth, ...(database ? [cstr(database)] : []), cstr(plugin),
  ]);
}

/** Complete packets in `out` from `at`, and where parsing stopped and why. */
export function serverPackets(out: Buffer, at = 0): { packets: { seq: number; payload: Buffer }[]; error: string | null; cutOff: boolean } {
  const packets: { seq: number; payload: Buffer }[] = [];
  let i = at;
  while (i < out.length) {
    if (out.length - i < 4) return { packets, error: `${out.length - i} trailing bytes`, cutOff: true };
    const len = out.readUIntLE(i, 3);
    if (out.length - i - 4 < len) return { packets, error: `a packet cut short (${out.length - i - 4} of ${len} bytes)`, cutOff: true };
    packets.push({ seq: out[i + 3]!, payload: out.subarray(i + 4, i + 4 + len) });
    i += 4 + len;
  }
  return { packets, error: null, cutOff: false };
}

const PROBE_TEXT = 'fuzz-probe-ok';

export function mysqlStream(): ServerStream {
  const errs = (out: Buffer) => serverPackets(out).packets.filter((p) => p.payload[0] === 0xff);
  return {
    malformed(out) {
      const { error, cutOff } = serverPackets(out);
      if (error && !cutOff) return `${error} in ${out.length} bytes of output`;
      for (const e of errs(out)) {
        if (e.payload.length < 4) return `an ERR packet of ${e.payload.length} bytes`;
        const errno = e.payload.readUInt16LE(1);
        if (errno === 0) return 'an ERR packet with errno 0';
        // After the greeting every ERR carries '#' and a 5-character SQLSTATE (protocol 4.1).
        if (e.payload[3] === 0x23 && !/^[0-9A-Z]{5}$/.test(e.payload.subarray(4, 9).toString('latin1'))) return `an ERR packet ${errno} with a bad SQLSTATE`;
        if (e.payload.length <= (e.payload[3] === 0x23 ? 9 : 3)) return `an ERR packet ${errno} without a message`;
      }
      return null;
    },
    cutOff(out) {
      return serverPackets(out).cutOff;
    },
    errors(out) {
      return errs(out).map((e) => (e.payload.length >= 3 ? String(e.payload.readUInt16LE(1)) : '?'));
    },
    probed(out) {
      return serverPackets(out).packets.some((p) => p.payload.includes(PROBE_TEXT));
    },
  };
}

/** Reads the greeting and logs in, following an AuthSwitchRequest and caching_sha2 fast auth; true once OK. */
export async function mysqlLogin(conn: WireConn, t: MysqlTarget, timeoutMs: number): Promise<boolean> {
  if (!(await conn.until((o) => serverPackets(o).packets.length > 0, timeoutMs))) return false;
  const greeting = parseGreeting(serverPackets(conn.output).packets[0]!.payload);
  if (!greeting) return false;
  conn.write(packet(handshakeResponse(t.user, scramble(greeting.plugin, t.password, greeting.nonce), greeting.plugin, t.database), 1));
  let seen = 1;
  for (let round = 0; round < 4; round++) {
    if (!(await conn.until((o) => serverPackets(o).packets.length > seen, timeoutMs))) return false;
    const p = serverPackets(conn.output).packets[seen]!;
    seen++;
    if (p.payload[0] === 0x00) return true;
    if (p.payload[0] === 0xff) return false;
    if (p.payload[0] === 0xfe) {
      const end = p.payload.indexOf(0, 1);
      const plugin = p.payload.subarray(1, end).toString();
      let nonce = p.payload.subarray(end + 1);
      if (nonce.at(-1) === 0) nonce = nonce.subarray(0, -1);
      conn.write(packet(scramble(plugin, t.password, nonce), p.seq + 1));
    } else if (p.payload[0] === 0x01 && p.payload[1] === 0x03) {
      continue; // caching_sha2 fast auth succeeded: the OK follows
    } else return false;
  }
  return false;
}

/** Waits for the answer (OK or ERR) to one command sent after `from` bytes of output; the OK's status flags, or null. */
async function mysqlOk(conn: WireConn, from: number, timeoutMs: number): Promise<number | null> {
  const done = (o: Buffer) => serverPackets(o.subarray(from)).packets.some((p) => p.payload[0] === 0x00 || p.payload[0] === 0xff);
  if (!(await conn.until(done, timeoutMs))) return null;
  const p = serverPackets(conn.output.subarray(from)).packets.find((x) => x.payload[0] === 0x00 || x.payload[0] === 0xff)!;
  if (p.payload[0] !== 0x00) return null;
  // OK: header, affected rows and last insert id (length-encoded; small here), then the status flags.
  let i = 1;
  for (let k = 0; k < 2; k++) i += p.payload[i]! < 0xfb ? 1 : p.payload[i] === 0xfc ? 3 : p.payload[i] === 0xfd ? 4 : 9;
  return p.payload.readUInt16LE(i);
}
const SERVER_STATUS_IN_TRANS = 0x1;

function queries(t: MysqlTarget, inTransaction: boolean): string[] {
  const base = [
    'SELECT 1', 'SELECT ?', `SELECT * FROM ${t.uncommittedTable}`, "SELECT REPEAT('x', 5000)", 'SELECT @@version', 'SELECT 1/0', 'SELEC 1', '',
    'SET @a = 1', 'ROLLBACK', 'SAVEPOINT s1', 'ROLLBACK TO SAVEPOINT s1', 'RELEASE SAVEPOINT s1', 'DO 1', 'SHOW TABLES', 'SELECT 1; SELECT 2',
    'SELECT CONNECTION_ID()', 'SHOW WARNINGS', "SELECT 'a' = ?", 'SELECT * FROM no_such_table', `SELECT COUNT(*) FROM ${t.uncommittedTable}`,
    'USE information_schema', 'SET NAMES utf8mb4', "SELECT CONVERT('x' USING latin1)",
  ];
  // In MySQL BEGIN inside a transaction commits it implicitly, so a transaction's fuzz never sends it.
  return inTransaction ? base : [...base, 'BEGIN', 'START TRANSACTION READ ONLY'];
}

const stmtId = (rng: Rng) => rng.pick([0, 1, 2, 3, 4, 0x7fffffff, 0xffffffff, rng.int(2 ** 32)]);

/** A command with a correct length and sequence id 0 (only its content is wrong), aimed after login. */
function softPacket(rng: Rng, t: MysqlTarget, inTransaction: boolean): Buffer {
  const sql = () => {
    const q = rng.pick(queries(t, inTransaction));
    return rng.chance(0.25) ? mutateText(rng, q) : q;
  };
  switch (rng.int(13)) {
    case 0:
    case 1:
    case 2:
      return comQuery(sql());
    case 3:
      return command(0x16, sql()); // COM_STMT_PREPARE
    case 4: {
      // COM_STMT_EXECUTE: an id that may or may not exist, flags, iterations, then parameters that may not fit.
      const params = rng.pick([Buffer.alloc(0), Buffer.from([0, 1, 0x08, 0, ...u32(7), 0, 0, 0, 0]), Buffer.from([0, 1, 0xfd, 0, 3, 0x61, 0x62, 0x63]), rng.bytes(rng.int(24))]);
      return command(0x17, Buffer.concat([u32(stmtId(rng)), Buffer.from([rng.pick([0, 1, 4, 0xff])]), u32(rng.pick([1, 0, 2])), params]));
    }
    case 5:
      return command(0x19, u32(stmtId(rng))); // COM_STMT_CLOSE (no answer)
    case 6:
      return command(0x1a, u32(stmtId(rng))); // COM_STMT_RESET
    case 7:
      return command(0x18, Buffer.concat([u32(stmtId(rng)), u16(rng.int(4)), rng.bytes(rng.int(40))])); // COM_STMT_SEND_LONG_DATA (no answer)
    case 8:
      return command(0x1c, Buffer.concat([u32(stmtId(rng)), u32(rng.pick([1, 100, 0]))])); // COM_STMT_FETCH
    case 9:
      return rng.pick([command(0x0e), command(0x09), command(0x1f)]); // PING, STATISTICS, RESET_CONNECTION
    case 10:
      return rng.pick([command(0x02, rng.pick([t.database ?? '', 'mysql', 'no_such_db', ''])), command(0x04, Buffer.concat([cstr(rng.pick([t.uncommittedTable, 'nope'])), Buffer.from('%')]))]); // INIT_DB, FIELD_LIST
    case 11:
      return command(0x1b, u16(rng.pick([0, 1, 7]))); // COM_SET_OPTION
    default:
      // Prepare then execute it at once with a guessed id (ids are per server connection, counting from 1).
      return Buffer.concat([command(0x16, 'SELECT ? + 1'), command(0x17, Buffer.concat([u32(rng.range(1, 4)), Buffer.from([0]), u32(1), Buffer.from([0, 1, 0x03, 0, ...u32(rng.int(100))])]))]);
  }
}

/** A packet whose framing or command is broken: random bytes, lying lengths, wrong sequence ids, odd commands, oversize. */
function hardPacket(rng: Rng, t: MysqlTarget, inTransaction = false): Buffer {
  switch (rng.int(9)) {
    case 0:
      return rng.bytes(rng.range(1, 64));
    case 1: {
      const p = softPacket(rng, t, inTransaction).subarray(4);
      return packet(p, 0, rng.pick([0, 1, p.length - 1, p.length + rng.range(1, 64), 0xffffff, 0xfffffe, rng.int(0xffffff)]));
    }
    case 2:
      return packet(softPacket(rng, t, inTransaction).subarray(4), rng.range(1, 255)); // a sequence id out of turn
    case 3:
      return command(rng.pick([0x00, 0x05, 0x06, 0x07, 0x08, 0x0a, 0x0b, 0x0c, 0x0d, 0x0f, 0x10, 0x12, 0x13, 0x14, 0x15, 0x1d, 0x1e, 0x20, 0x7f, 0xfe, 0xff]), rng.bytes(rng.int(16)));
    case 4:
      return command(0x11, rng.bytes(rng.int(40))); // COM_CHANGE_USER with garbage
    case 5:
    case 6:
      return mutateBytes(rng, softPacket(rng, t, inTransaction));
    case 7:
      // Oversized: a 16 MiB claim with a little of it, or a real multi-megabyte statement.
      return rng.chance(0.7) ? packet(Buffer.from([0x03, 0x53]), 0, 0xfffff0) : comQuery(`SELECT '${'z'.repeat(rng.range(1, 3) << 20)}'`);
    default:
      return rng.chance(0.5) ? command(0x01) : Buffer.alloc(0); // COM_QUIT, or nothing at all
  }
}

/** A packet aimed at the handshake (sent with or without reading the greeting first). */
function handshakePacket(rng: Rng, t: MysqlTarget, greeting: Greeting | null): Buffer {
  const plugin = greeting?.plugin ?? 'mysql_native_password';
  const good = () => handshakeResponse(t.user, scramble(plugin, t.password, greeting?.nonce ?? Buffer.alloc(20)), plugin, t.database);
  switch (rng.int(10)) {
    case 0:
      return rng.bytes(rng.range(1, 128));
    case 1:
      return packet(mutateBytes(rng, good()), 1);
    case 2: {
      const p = good();
      return packet(p, 1, rng.pick([0, 4, p.length - 3, p.length + 50, 0xffffff]));
    }
    case 3:
      return packet(handshakeResponse(t.user, scramble(plugin, `wrong-${rng.int(1e9)}`, greeting?.nonce ?? Buffer.alloc(20)), plugin, t.database), 1);
    case 4:
      return packet(handshakeResponse(rng.pick(['no-such-pool', '', 'x'.repeat(300), `${t.user}x`]), scramble(plugin, t.password, greeting?.nonce ?? Buffer.alloc(20)), plugin), 1);
    case 5:
      // An SSL request when no TLS was offered, then nothing.
      return packet(Buffer.concat([u32(CLIENT_CAPS | CAP.SSL), u32(1 << 24), Buffer.from([45]), Buffer.alloc(23)]), 1);
    case 6:
      return packet(handshakeResponse(t.user, rng.bytes(rng.pick([0, 1, 19, 20, 32, 200])), rng.pick(['mysql_old_password', 'sha256_password', 'dialog', 'x'.repeat(100), plugin]), t.database), 1);
    case 7:
      // Protocol 3.20 capabilities (no PROTOCOL_41), or attributes whose length lies.
      return rng.chance(0.5)
        ? packet(Buffer.concat([u16(CAP.LONG_PASSWORD), Buffer.from([0, 0, 0]), cstr(t.user), Buffer.from('12345678')]), 1)
        : packet(Buffer.concat([handshakeResponse(t.user, Buffer.alloc(20), plugin, t.database, CLIENT_CAPS | CAP.CONNECT_ATTRS), Buffer.from([0xfc, 0xff, 0xff, 1, 2])]), 1);
    case 8:
      return packet(handshakeResponse(t.user, scramble(plugin, t.password, greeting?.nonce ?? Buffer.alloc(20)), plugin, rng.pick(['no_such_db', 'mysql', 'x'.repeat(200)])), 1);
    default:
      return hardPacket(rng, t);
  }
}

/** The MySQL client protocol for `mixScenarios`. */
export function mysqlProtocol(t: MysqlTarget, timeoutMs: number): Protocol {
  return {
    phases: { connect: 'pre-greeting', auth: 'handshake' },
    connectFrame: (rng) => handshakePacket(rng, t, null),
    async authFrames(conn, rng, n) {
      if (!(await conn.until((o) => serverPackets(o).packets.length > 0, timeoutMs))) return null;
      const greeting = parseGreeting(serverPackets(conn.output).packets[0]!.payload);
      return Array.from({ length: n }, () => handshakePacket(rng, t, greeting));
    },
    softFrame: (rng, inTxn) => softPacket(rng, t, inTxn),
    hardFrame: (rng, inTxn) => hardPacket(rng, t, inTxn),
    login: (conn) => mysqlLogin(conn, t, timeoutMs),
    async beginAndInsert(conn, rng) {
      let from = conn.output.length;
      conn.write(comQuery('START TRANSACTION'));
      const s1 = await mysqlOk(conn, from, timeoutMs);
      if (s1 === null || !(s1 & SERVER_STATUS_IN_TRANS)) return false;
      from = conn.output.length;
      conn.write(comQuery(`INSERT INTO ${t.uncommittedTable} (note) VALUES ('fuzz ${rng.int(1e9)}')`));
      const s2 = await mysqlOk(conn, from, timeoutMs);
      return s2 !== null && (s2 & SERVER_STATUS_IN_TRANS) !== 0;
    },
    probe: comQuery(`SELECT '${PROBE_TEXT}'`),
  };
}
