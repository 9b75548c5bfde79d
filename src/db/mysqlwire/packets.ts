// MySQL protocol constants and the few packets poolgate writes itself (OK, ERR, EOF, handshake, auth
// switch), plus length-encoded integer reading. Everything else travels as the server's raw bytes.

export const MAX_PAYLOAD = 0xffffff;

/** Capability flags (only those poolgate reads or sets). */
export const CLIENT = {
  LONG_PASSWORD: 0x1,
  FOUND_ROWS: 0x2,
  LONG_FLAG: 0x4,
  CONNECT_WITH_DB: 0x8,
  LOCAL_FILES: 0x80,
  PROTOCOL_41: 0x200,
  SSL: 0x800,
  TRANSACTIONS: 0x2000,
  SECURE_CONNECTION: 0x8000,
  MULTI_STATEMENTS: 0x10000,
  MULTI_RESULTS: 0x20000,
  PS_MULTI_RESULTS: 0x40000,
  PLUGIN_AUTH: 0x80000,
  CONNECT_ATTRS: 0x100000,
  PLUGIN_AUTH_LENENC: 0x200000,
  SESSION_TRACK: 0x800000,
} as const;

/** What both sides of poolgate always speak: no compression, classic EOF packets. */
export const BASE_CAPABILITIES =
  CLIENT.LONG_PASSWORD |
  CLIENT.LONG_FLAG |
  CLIENT.CONNECT_WITH_DB |
  CLIENT.PROTOCOL_41 |
  CLIENT.TRANSACTIONS |
  CLIENT.SECURE_CONNECTION |
  CLIENT.MULTI_RESULTS |
  CLIENT.PS_MULTI_RESULTS |
  CLIENT.PLUGIN_AUTH |
  CLIENT.PLUGIN_AUTH_LENENC;

/**
 * Capabilities a client may choose that change what the server sends: a server connection is opened with the
 * same. LOCAL_FILES among them: a server connection may ask for a local file only if its client allowed it.
 */
export const VARIANT_CAPABILITIES = CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS | CLIENT.SESSION_TRACK | CLIENT.LOCAL_FILES;

/**
 * Capabilities offered only when every pool's server offers them (server-identity.ts): session tracking
 * (OK packets carry the server's session-state changes, e.g. a new character_set_client, for the client
 * to follow; its connection is the pinned one that changed).
 */
export const LEARNED_CAPABILITIES = CLIENT.SESSION_TRACK;

/**
 * MariaDB's extended capabilities (the upper 32 bits, shifted down): a MariaDB server leaves CLIENT_MYSQL
 * (LONG_PASSWORD) unset and sends them in the last 4 of the greeting's 10 reserved bytes; a client that
 * leaves CLIENT_MYSQL unset answers with its own in the last 4 of the response's 23 reserved bytes.
 */
export const MARIADB = {
  /** COM_STMT_BULK_EXECUTE: one prepared statement run for many rows of parameters in one packet. */
  STMT_BULK_OPERATIONS: 0x4,
  /** Column definitions carry a type name / format block (e.g. format "json" on a LONGTEXT column). */
  EXTENDED_METADATA: 0x8,
} as const;

/**
 * The MariaDB capabilities poolgate can pass through: extended metadata changes only the bytes of column
 * definitions; bulk operations add one command (COM_STMT_BULK_EXECUTE, mapped as COM_STMT_EXECUTE is).
 */
export const PASSABLE_MARIADB_CAPABILITIES = MARIADB.EXTENDED_METADATA | MARIADB.STMT_BULK_OPERATIONS;

/**
 * Poolgate's own bit in a variant (bit 30, a classic capability poolgate never negotiates): the client
 * negotiated MARIADB.EXTENDED_METADATA, so its server connections must be opened with it too.
 */
export const VARIANT_MARIADB_METADATA = 0x40000000;

export const STATUS = {
  IN_TRANS: 0x0001,
  AUTOCOMMIT: 0x0002,
  MORE_RESULTS: 0x0008,
  CURSOR_EXISTS: 0x0040,
} as const;

export const COM = {
  QUIT: 0x01,
  INIT_DB: 0x02,
  QUERY: 0x03,
  FIELD_LIST: 0x04,
  STATISTICS: 0x09,
  PROCESS_KILL: 0x0c,
  PING: 0x0e,
  CHANGE_USER: 0x11,
  STMT_PREPARE: 0x16,
  STMT_EXECUTE: 0x17,
  STMT_SEND_LONG_DATA: 0x18,
  STMT_CLOSE: 0x19,
  STMT_RESET: 0x1a,
  SET_OPTION: 0x1b,
  STMT_FETCH: 0x1c,
  /** MariaDB's COM_STMT_BULK_EXECUTE. */
  STMT_BULK_EXECUTE: 0xfa,
  RESET_CONNECTION: 0x1f,
} as const;

function header(len: number, seq: number): Buffer {
  const h = Buffer.allocUnsafe(4);
  h.writeUIntLE(len, 0, 3);
  h[3] = seq & 0xff;
  return h;
}

/** utf8mb4_general_ci: the collation poolgate announces. */
export const DEFAULT_COLLATION = 45;

/**
 * Frames `payload` as one packet with sequence id `seq`; a payload of 16 MiB - 1 or more is split as the
 * protocol does (pieces of 0xFFFFFF bytes with rising sequence ids, then a shorter one, maybe empty).
 */
export function frame(seq: number, payload: Buffer): Buffer {
  if (payload.length >= MAX_PAYLOAD) {
    const pieces: Buffer[] = [];
    let at = 0;
    for (;;) {
      const n = Math.min(MAX_PAYLOAD, payload.length - at);
      pieces.push(header(n, seq++), payload.subarray(at, at + n));
      at += n;
      if (n < MAX_PAYLOAD) return Buffer.concat(pieces);
    }
  }
  const out = Buffer.allocUnsafe(4 + payload.length);
  out.writeUIntLE(payload.length, 0, 3);
  out[3] = seq & 0xff;
  payload.copy(out, 4);
  return out;
}

export function okPacket(seq: number, status: number, affectedRows = 0): Buffer {
  // 0x00, affected rows, last insert id (lenenc, both < 251 here), status, warnings.
  return frame(seq, Buffer.from([0x00, affectedRows, 0, status & 0xff, status >> 8, 0, 0]));
}

export function eofPacket(seq: number, status: number): Buffer {
  return frame(seq, Buffer.from([0xfe, 0, 0, status & 0xff, status >> 8]));
}

export function errPacket(seq: number, errno: number, sqlState: string, message: string): Buffer {
  const msg = Buffer.from(message, 'utf8');
  const p = Buffer.allocUnsafe(9 + msg.length);
  p[0] = 0xff;
  p.writeUInt16LE(errno, 1);
  p[3] = 0x23; // '#'
  p.write(sqlState.padEnd(5, '0').slice(0, 5), 4, 'latin1');
  msg.copy(p, 9);
  return frame(seq, p);
}

/**
 * Initial handshake (protocol 10) offering caching_sha2_password with a 20-byte nonce. With MariaDB
 * capabilities, CLIENT_MYSQL is left unset and they go in the reserved bytes, as a MariaDB server sends them.
 */
export function handshakePacket(version: string, connectionId: number, nonce: Buffer, capabilities: number, status: number, mariadbCapabilities = 0): Buffer {
  if (mariadbCapabilities !== 0) capabilities &= ~CLIENT.LONG_PASSWORD;
  const v = Buffer.from(version + '\0', 'latin1');
  const plugin = Buffer.from('caching_sha2_password\0', 'latin1');
  const p = Buffer.alloc(1 + v.length + 4 + 8 + 1 + 2 + 1 + 2 + 2 + 1 + 10 + 13 + plugin.length);
  let o = 0;
  p[o++] = 10;
  v.copy(p, o);
  o += v.length;
  p.writeUInt32LE(connectionId >>> 0, o);
  o += 4;
  nonce.copy(p, o, 0, 8);
  o += 8;
  p[o++] = 0;
  p.writeUInt16LE(capabilities & 0xffff, o);
  o += 2;
  p[o++] = DEFAULT_COLLATION;
  p.writeUInt16LE(status, o);
  o += 2;
  p.writeUInt16LE(capabilities >>> 16, o);
  o += 2;
  p[o++] = 21;
  if (mariadbCapabilities !== 0) p.writeUInt32LE(mariadbCapabilities >>> 0, o + 6);
  o += 10;
  nonce.copy(p, o, 8, 20);
  o += 13; // 12 nonce bytes and a NUL
  plugin.copy(p, o);
  return frame(0, p);
}

export function authSwitchPacket(seq: number, plugin: string, data: Buffer): Buffer {
  return frame(seq, Buffer.concat([Buffer.from([0xfe]), Buffer.from(plugin + '\0', 'latin1'), data, Buffer.from([0])]));
}

/** A length-encoded integer at `at`: [value, bytes used]; null when it does not fit in `buf`. */
export function readLenenc(buf: Buffer, at: number): [number, number] | null {
  if (at >= buf.length) return null;
  const b = buf[at]!;
  if (b < 0xfb) return [b, 1];
  if (b === 0xfc) return at + 3 <= buf.length ? [buf.readUInt16LE(at + 1), 3] : null;
  if (b === 0xfd) return at + 4 <= buf.length ? [buf.readUIntLE(at + 1, 3), 4] : null;
  if (b === 0xfe) return at + 9 <= buf.length ? [Number(buf.readBigUInt64LE(at + 1)), 9] : null;
  return null; // 0xfb (NULL) and 0xff are not integers
}

export function writeLenenc(n: number): Buffer {
  if (n < 0xfb) return Buffer.from([n]);
  if (n < 0x10000) return Buffer.from([0xfc, n & 0xff, n >> 8]);
  const b = Buffer.alloc(4);
  b[0] = 0xfd;
  b.writeUIntLE(n, 1, 3);
  return b;
}

/** NUL-terminated string at `at`: [text, next offset]; null when there is no NUL. */
export function readNulString(buf: Buffer, at: number): [string, number] | null {
  const end = buf.indexOf(0, at);
  if (end < 0) return null;
  return [buf.toString('utf8', at, end), end + 1];
}

/** Status flags of an OK packet payload (0x00 or 0xfe with OK layout); null when it is cut. */
export function okStatus(payload: Buffer): number | null {
  const a = readLenenc(payload, 1);
  if (!a) return null;
  const b = readLenenc(payload, 1 + a[1]);
  if (!b) return null;
  const at = 1 + a[1] + b[1];
  return at + 2 <= payload.length ? payload.readUInt16LE(at) : null;
}

/** Splits whole frames out of `buf` (as the server sent them): [seq, payload] each. */
export function splitPackets(buf: Buffer): Array<{ seq: number; payload: Buffer }> {
  const out: Array<{ seq: number; payload: Buffer }> = [];
  let at = 0;
  while (at + 4 <= buf.length) {
    const len = buf.readUIntLE(at, 3);
    if (at + 4 + len > buf.length) break;
    out.push({ seq: buf[at + 3]!, payload: buf.subarray(at + 4, at + 4 + len) });
    at += 4 + len;
  }
  return out;
}
