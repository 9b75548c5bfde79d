// PostgreSQL frontend-protocol fuzz frames (startup, auth, simple and extended query, COPY) and a checker
// of everything the server answers, for test/pgwire-fuzz.test.ts.
import { createHash } from 'node:crypto';
import { lyingLength, mutateBytes, mutateText, type Protocol, type Rng, type ServerStream, type WireConn } from './wire-fuzz.js';

export interface PgTarget {
  user: string;
  database: string;
  /** The startup `options` parameter (`pool=<sub>` for poolgate), if any. */
  options?: string;
  password?: string;
  /** A table no fuzz connection may leave a committed row in. */
  uncommittedTable: string;
  /** A table COPY FROM STDIN may write to. */
  copyTable: string;
}

const cstr = (s: string | Buffer) => Buffer.concat([typeof s === 'string' ? Buffer.from(s) : s, Buffer.from([0])]);
const i16 = (n: number) => {
  const b = Buffer.alloc(2);
  b.writeInt16BE(n << 16 >> 16);
  return b;
};
const i32 = (n: number) => {
  const b = Buffer.alloc(4);
  b.writeInt32BE(n | 0);
  return b;
};

/** A typed frontend message: type byte, int32 length (itself included), payload. */
export function msg(type: string | number, payload: Buffer = Buffer.alloc(0), length?: number): Buffer {
  const head = Buffer.alloc(5);
  head[0] = typeof type === 'string' ? type.charCodeAt(0) : type;
  head.writeInt32BE((length ?? payload.length + 4) | 0, 1);
  return Buffer.concat([head, payload]);
}

/** An untyped startup-phase packet: int32 length, int32 code, payload. */
export function untyped(code: number, payload: Buffer = Buffer.alloc(0), length?: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeInt32BE((length ?? payload.length + 8) | 0, 0);
  b.writeInt32BE(code | 0, 4);
  return Buffer.concat([b, payload]);
}

export function startup(params: Record<string, string>, version = 196608): Buffer {
  const parts = Object.entries(params).flatMap(([k, v]) => [cstr(k), cstr(v)]);
  return untyped(version, Buffer.concat([...parts, Buffer.from([0])]));
}

export const query = (sql: string | Buffer) => msg('Q', cstr(sql));
export const sync = () => msg('S');
const parse = (name: string, sql: string, oids: number[] = []) => msg('P', Buffer.concat([cstr(name), cstr(sql), i16(oids.length), ...oids.map(i32)]));
const bind = (portal: string, stmt: string, params: (Buffer | null)[], formats: number[] = [], resultFormats: number[] = []) =>
  msg('B', Buffer.concat([
    cstr(portal), cstr(stmt), i16(formats.length), ...formats.map(i16), i16(params.length),
    ...params.map((p) => (p === null ? i32(-1) : Buffer.concat([i32(p.length), p]))), i16(resultFormats.length), ...resultFormats.map(i16),
  ]));
const describe = (kind: string, name: string) => msg('D', Buffer.concat([Buffer.from(kind), cstr(name)]));
const execute = (portal: string, maxRows = 0) => msg('E', Buffer.concat([cstr(portal), i32(maxRows)]));
const close = (kind: string, name: string) => msg('C', Buffer.concat([Buffer.from(kind), cstr(name)]));

function queries(t: PgTarget, inTransaction: boolean): string[] {
  const base = [
    'SELECT 1', 'SELECT $1::int', `SELECT * FROM ${t.copyTable}`, "SELECT repeat('x', 5000)", 'SHOW server_version', 'SELECT 1/0', 'SELEC 1', '',
    "SET application_name = 'fuzz'", 'ROLLBACK', 'SAVEPOINT s1', 'RELEASE s1', 'ROLLBACK TO s1', 'LISTEN fuzz_chan', 'UNLISTEN *',
    'COPY (SELECT g FROM generate_series(1, 20) g) TO STDOUT', 'DISCARD ALL', 'DEALLOCATE ALL', 'PREPARE fz AS SELECT 1', 'EXECUTE fz',
    'SELECT pg_backend_pid()', 'SELECT 1; SELECT 2', `SELECT count(*) FROM ${t.uncommittedTable}`,
  ];
  // COPY FROM STDIN writes to its own sink table; BEGIN is harmless in PostgreSQL (a warning inside a transaction).
  return inTransaction ? base : [...base, `COPY ${t.copyTable} FROM STDIN`, 'BEGIN'];
}

const stmtNames = ['', 's1', 's2', 'fz', 'nope', 'x'.repeat(70)];
const portalNames = ['', 'p1', 'nope'];

/** A frame with valid framing aimed at the state after authentication. */
function softFrame(rng: Rng, t: PgTarget, inTransaction: boolean): Buffer {
  const sql = () => {
    const q = rng.pick(queries(t, inTransaction));
    return rng.chance(0.25) ? mutateText(rng, q) : q;
  };
  const param = (): Buffer | null => rng.pick([null, Buffer.from('1'), Buffer.from('abc'), rng.bytes(rng.int(12)), Buffer.from([0, 0, 0, 1])]);
  switch (rng.int(14)) {
    case 0:
    case 1:
    case 2:
      return query(sql());
    case 3:
      return parse(rng.pick(stmtNames), sql(), rng.chance(0.7) ? [] : Array.from({ length: rng.int(3) }, () => rng.pick([0, 23, 25, 1043, 99999, -1])));
    case 4:
      return bind(rng.pick(portalNames), rng.pick(stmtNames), Array.from({ length: rng.int(3) }, param), rng.chance(0.2) ? [rng.pick([0, 1, 2, -1])] : [], rng.chance(0.2) ? [rng.pick([0, 1, 7])] : []);
    case 5:
      return describe(rng.pick(['S', 'P', 'X']), rng.pick([...stmtNames, ...portalNames]));
    case 6:
      return execute(rng.pick(portalNames), rng.pick([0, 1, -1, 1000]));
    case 7:
      return close(rng.pick(['S', 'P', 'Q']), rng.pick([...stmtNames, ...portalNames]));
    case 8:
      return rng.chance(0.5) ? sync() : msg('H');
    case 9:
      // COPY sub-protocol messages, usually out of place.
      return rng.pick([msg('d', Buffer.from(`${rng.int(1000)}\n`)), msg('d', rng.bytes(rng.int(20))), msg('c'), msg('f', cstr('fuzz copy fail'))]);
    case 10:
      // A valid extended-protocol round: named or unnamed, sometimes re-bound after a Close.
      return Buffer.concat([parse('s1', 'SELECT $1::int + 1', [23]), bind('', 's1', [Buffer.from(String(rng.int(100)))]), describe('P', ''), execute(''), ...(rng.chance(0.5) ? [close('S', 's1')] : []), sync()]);
    case 11:
      // FunctionCall of an object id that names no function.
      return msg('F', Buffer.concat([i32(rng.range(2_000_000_000, 2_100_000_000)), i16(0), i16(1), i32(1), Buffer.from('1'), i16(0)]));
    case 12:
      return Buffer.concat([parse('', sql()), bind('', '', []), execute('', rng.pick([0, 1])), sync()]);
    default:
      return query(`SELECT '${'y'.repeat(rng.int(300))}'`);
  }
}

/** A frame whose framing is broken: random bytes, wrong type bytes, lying lengths, damaged frames, oversize. */
function hardFrame(rng: Rng, t: PgTarget, inTransaction = false): Buffer {
  switch (rng.int(8)) {
    case 0:
      return rng.bytes(rng.range(1, 64));
    case 1: {
      const payload = softFrame(rng, t, inTransaction).subarray(5);
      return msg(rng.pick(['Q', 'P', 'B', 'E', 'D', 'd', 'p', 'S']), payload, lyingLength(rng, payload.length + 4));
    }
    case 2:
      // A type byte no frontend message has, with an honest length.
      return msg(rng.pick([0, 0x01, 0x7f, 0xff, 'Z'.charCodeAt(0), 'R'.charCodeAt(0), 'T'.charCodeAt(0), 'a'.charCodeAt(0)]), rng.bytes(rng.int(16)));
    case 3:
    case 4:
      return mutateBytes(rng, softFrame(rng, t, inTransaction));
    case 5:
      // Oversized: a 1 GiB claim with a little of it, or a real multi-megabyte query.
      return rng.chance(0.8) ? msg('Q', Buffer.from('SELECT 1'), 0x40000000) : query(`SELECT '${'z'.repeat(rng.range(1, 3) << 20)}'`);
    case 6:
      return msg('X');
    default:
      return Buffer.concat([softFrame(rng, t, inTransaction), rng.bytes(rng.range(1, 8))]);
  }
}

/** A frame aimed at the startup phase (nothing sent yet). */
function startupFrame(rng: Rng, t: PgTarget): Buffer {
  const good = () => startup({ user: t.user, database: t.database, ...(t.options ? { options: t.options } : {}) });
  switch (rng.int(10)) {
    case 0:
      return rng.bytes(rng.range(1, 128));
    case 1:
      return mutateBytes(rng, good());
    case 2: {
      const s = good();
      s.writeInt32BE(lyingLength(rng, s.length), 0);
      return s;
    }
    case 3:
      return untyped(rng.pick([80877103, 80877104]));
    case 4:
      return untyped(80877102, Buffer.concat([i32(rng.int(2 ** 31)), i32(rng.int(2 ** 31))]), rng.chance(0.3) ? 12 : undefined);
    case 5:
      return startup({ user: t.user, database: t.database, options: rng.pick(['pool=no-such-pool', 'pool=', '-c pool=' + 'q'.repeat(200), 'pool', '-c', '\u00ff\u00fe']) });
    case 6:
      return startup({ user: t.user, database: t.database, ...(t.options ? { options: t.options } : {}) }, rng.pick([0, 0x00020000, 0x00030001, 0x00040000, 0x04d2162f, -1]));
    case 7:
      return startup({ user: t.user, database: t.database, ...(t.options ? { options: t.options } : {}), big: 'b'.repeat(rng.pick([9000, 20000, 70000])) });
    case 8:
      return startup({ user: t.user, database: t.database, replication: rng.pick(['true', 'database']), ...(t.options ? { options: t.options } : {}) });
    default:
      // Parameters without their terminators.
      return untyped(196608, Buffer.from(`user\0${t.user}\0database`));
  }
}

/** A frame aimed at the password exchange. */
function authFrame(rng: Rng, t: PgTarget): Buffer {
  switch (rng.int(7)) {
    case 0:
      return msg('p', cstr(`wrong-${rng.int(1e9)}`));
    case 1:
      return mutateBytes(rng, msg('p', cstr(t.password ?? 'pw')));
    case 2: {
      const p = cstr(t.password ?? 'pw');
      return msg('p', p, lyingLength(rng, p.length + 4));
    }
    case 3:
      // SASLInitialResponse for a mechanism nobody offered.
      return msg('p', Buffer.concat([cstr('SCRAM-SHA-256'), i32(32), Buffer.from('n,,n=,r=' + 'A'.repeat(24))]));
    case 4:
      return msg('p', Buffer.from(t.password ?? 'pw')); // no terminator
    case 5:
      return hardFrame(rng, t);
    default:
      return rng.bytes(rng.range(1, 40));
  }
}

/** Reads the backend messages in `out` from `at`: complete ones, and where parsing stopped and why. */
export function backendMessages(out: Buffer, at = 0): { messages: { type: string; body: Buffer }[]; error: string | null; cutOff: boolean } {
  const messages: { type: string; body: Buffer }[] = [];
  let i = at;
  while (i < out.length) {
    if (out.length - i < 5) return { messages, error: `${out.length - i} trailing bytes`, cutOff: true };
    const type = String.fromCharCode(out[i]!);
    const len = out.readInt32BE(i + 1);
    if (!BACKEND_TYPES.has(type)) return { messages, error: `unknown backend message type 0x${out[i]!.toString(16)}`, cutOff: false };
    if (len < 4 || len > 1 << 30) return { messages, error: `length ${len} of a ${type} message`, cutOff: false };
    if (out.length - i - 1 < len) return { messages, error: `a ${type} message cut short (${out.length - i - 1} of ${len})`, cutOff: true };
    messages.push({ type, body: out.subarray(i + 5, i + 1 + len) });
    i += 1 + len;
  }
  return { messages, error: null, cutOff: false };
}
const BACKEND_TYPES = new Set([...'RKSZTDCEINsntGHWAVcdv123']);

/** The fields of an ErrorResponse / NoticeResponse body, or null when they are not well formed. */
export function errorFields(body: Buffer): Map<string, string> | null {
  const fields = new Map<string, string>();
  let i = 0;
  while (i < body.length && body[i] !== 0) {
    const end = body.indexOf(0, i + 1);
    if (end < 0) return null;
    fields.set(String.fromCharCode(body[i]!), body.subarray(i + 1, end).toString('utf8'));
    i = end + 1;
  }
  return i === body.length - 1 ? fields : null;
}

const PROBE_TEXT = 'fuzz-probe-ok';

/** A protocol-2.0 error (what PostgreSQL answers a 2.0 startup with): 'E', text, NUL, then the close. */
const isV2Error = (out: Buffer, from: number) => out[from] === 0x45 && /^E[\x20-\x7e\n]+\0$/.test(out.subarray(from).toString('latin1'));

export function pgStream(): ServerStream {
  /** Where backend messages start: past one-byte answers to SSLRequest / GSSENCRequest; -1 after 'S' or 'G' (encryption follows). */
  const skipAnswers = (out: Buffer, phase: string) => {
    let i = 0;
    const notMessage = (at: number) => out.length - at < 5 || out.readInt32BE(at + 1) > 1 << 20 || out.readInt32BE(at + 1) < 4;
    while (phase === 'startup' && i < out.length && notMessage(i)) {
      if (out[i] === 0x53 || out[i] === 0x47) return -1;
      if (out[i] !== 0x4e) break;
      i++;
    }
    return i;
  };
  return {
    malformed(out, phase) {
      const from = skipAnswers(out, phase);
      if (from < 0) return null;
      // A startup packet asking for protocol 2 is refused the way a 2.0 client reads it: 'E', text, NUL, close.
      if (phase === 'startup' && isV2Error(out, from)) return null;
      const { messages, error, cutOff } = backendMessages(out, from);
      if (error && !cutOff) return `${error} in ${out.length} bytes of output`;
      for (const m of messages) {
        if (m.type !== 'E') continue;
        const f = errorFields(m.body);
        if (!f) return 'an ErrorResponse whose fields are not well formed';
        if (!/^[0-9A-Z]{5}$/.test(f.get('C') ?? '')) return `an ErrorResponse without a SQLSTATE (${JSON.stringify([...f])})`;
        if (!f.get('M')) return 'an ErrorResponse without a message';
      }
      return null;
    },
    cutOff(out, phase) {
      const from = skipAnswers(out, phase);
      return from >= 0 && !isV2Error(out, from) && backendMessages(out, from).cutOff;
    },
    errors(out) {
      const codes: string[] = [];
      const from = skipAnswers(out, 'startup');
      if (from < 0) return [];
      if (isV2Error(out, from)) return ['v2'];
      for (const m of backendMessages(out, from).messages) {
        if (m.type === 'E') codes.push(errorFields(m.body)?.get('C') ?? '?');
      }
      return codes;
    },
    probed(out) {
      return backendMessages(out, Math.max(0, skipAnswers(out, 'startup'))).messages.some((m) => m.type === 'D' && m.body.includes(PROBE_TEXT));
    },
  };
}

/** Startup and password exchange; resolves once ReadyForQuery arrives (false on an error or close). */
export async function pgLogin(conn: WireConn, t: PgTarget, timeoutMs: number): Promise<boolean> {
  conn.write(startup({ user: t.user, database: t.database, ...(t.options ? { options: t.options } : {}) }));
  const auth = await conn.until((o) => backendMessages(o).messages.some((m) => m.type === 'R' || m.type === 'E'), timeoutMs);
  if (!auth) return false;
  const r = backendMessages(conn.output).messages.find((m) => m.type === 'R' || m.type === 'E')!;
  if (r.type === 'E') return false;
  const code = r.body.readInt32BE(0);
  if (code === 3) conn.write(msg('p', cstr(t.password ?? '')));
  else if (code === 5) {
    const inner = createHash('md5').update((t.password ?? '') + t.user).digest('hex');
    conn.write(msg('p', cstr('md5' + createHash('md5').update(inner).update(r.body.subarray(4, 8)).digest('hex'))));
  } else if (code !== 0) return false;
  return pgUntilReady(conn, timeoutMs);
}

/** Waits for a ReadyForQuery after what was last sent; false if an ErrorResponse came with it or the server closed. */
async function pgUntilReady(conn: WireConn, timeoutMs: number, from = 0): Promise<boolean> {
  const ok = await conn.until((o) => backendMessages(o.subarray(from)).messages.some((m) => m.type === 'Z'), timeoutMs);
  return ok && !backendMessages(conn.output.subarray(from)).messages.some((m) => m.type === 'E');
}

/** Transaction status ('I', 'T', 'E') of the last ReadyForQuery in the output. */
function lastStatus(out: Buffer): string | null {
  const z = backendMessages(out).messages.filter((m) => m.type === 'Z').at(-1);
  return z ? String.fromCharCode(z.body[0]!) : null;
}

/** The PostgreSQL frontend protocol for `mixScenarios`. */
export function pgProtocol(t: PgTarget, timeoutMs: number): Protocol {
  const startMessage = () => startup({ user: t.user, database: t.database, ...(t.options ? { options: t.options } : {}) });
  return {
    phases: { connect: 'startup', auth: 'auth' },
    connectFrame: (rng) => startupFrame(rng, t),
    async authFrames(conn, rng, n) {
      conn.write(startMessage());
      const asked = await conn.until((o) => backendMessages(o).messages.some((m) => m.type === 'R' || m.type === 'E'), timeoutMs);
      return asked ? Array.from({ length: n }, () => authFrame(rng, t)) : null;
    },
    softFrame: (rng, inTxn) => softFrame(rng, t, inTxn),
    hardFrame: (rng, inTxn) => hardFrame(rng, t, inTxn),
    login: (conn) => pgLogin(conn, t, timeoutMs),
    async beginAndInsert(conn, rng) {
      let from = conn.output.length;
      conn.write(query('BEGIN'));
      if (!(await pgUntilReady(conn, timeoutMs, from)) || lastStatus(conn.output) !== 'T') return false;
      from = conn.output.length;
      conn.write(query(`INSERT INTO ${t.uncommittedTable} (note) VALUES ('fuzz ${rng.int(1e9)}')`));
      return (await pgUntilReady(conn, timeoutMs, from)) && lastStatus(conn.output) === 'T';
    },
    // Ends any COPY and aborted transaction, then asks for the probe's row.
    probe: Buffer.concat([msg('f', cstr('probe')), sync(), query('ROLLBACK'), query(`SELECT '${PROBE_TEXT}'`)]),
  };
}
