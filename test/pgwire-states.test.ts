// Issue 30, "the listeners as state machines" (PostgreSQL): a message that is not legal in the state the
// connection is in is answered with a FATAL ErrorResponse that says what the session was waiting for
// (session-states.ts), with the SQLSTATE it always had, the connection is closed, and whatever it held comes
// back: the governor slot, and the server connection (rolled back and idle again when it was between
// statements, closed when work was owed on it), with PostgreSQL seeing exactly the connections poolgate
// holds. One raw client per state.
import t, { type Test } from 'tap';
import { rmSync } from 'node:fs';
import { needServer } from './helpers/servers.js';
import { startWirePool, type WirePool } from './helpers/pgwire.js';
import { until } from './helpers/until.js';
import { rawSocket, type Framing } from './helpers/raw-socket.js';
import { selfSignedCert } from './helpers/origin.js';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  // A certificate, so that an SSLRequest is accepted (state 'tls').
  const { dir, certFile, keyFile } = selfSignedCert();
  const w: WirePool = await startWirePool({ maxConcurrent: 1, settings: { queueTimeoutMs: 20_000 }, overrides: { wireTlsCertFile: certFile, wireTlsKeyFile: keyFile } });
  t.teardown(async () => {
    await w.close();
    rmSync(dir, { recursive: true, force: true });
  });
  await w.direct.query('CREATE TABLE f (id int PRIMARY KEY)');
  await w.direct.query(`GRANT ALL ON f TO ${w.role}`);
  const listener = w.svc.service.pgWire!;
  const governor = w.svc.service.dataplane!.governor;

  const message = (type: string, body: Buffer = Buffer.alloc(0)) => {
    const head = Buffer.alloc(5);
    head[0] = type.charCodeAt(0);
    head.writeInt32BE(4 + body.length, 1);
    return Buffer.concat([head, body]);
  };
  const cstr = (s: string) => Buffer.from(`${s}\0`);
  const query = (sql: string) => message('Q', cstr(sql));
  const startup = (params: Record<string, string>, version = 196608) => {
    const body = Buffer.concat([...Object.entries(params).map(([k, v]) => cstr(`${k}\0${v}`)), Buffer.from([0])]);
    const head = Buffer.alloc(8);
    head.writeInt32BE(8 + body.length, 0);
    head.writeInt32BE(version, 4);
    return Buffer.concat([head, body]);
  };
  const sslRequest = () => Buffer.from([0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);
  const password = () => message('p', cstr(w.key));
  /** A message type no client may send (PostgreSQL: "invalid frontend message type 122"). */
  const bogus = () => message('z');

  type Message = { type: string; body: Buffer };
  /** A PostgreSQL message: its type byte, a 4-byte length, the body. */
  const pgMessage: Framing<Message> = (buf) => {
    if (buf.length < 5 || buf.length < 1 + buf.readInt32BE(1)) return null;
    const len = buf.readInt32BE(1);
    return { value: { type: String.fromCharCode(buf[0]!), body: buf.subarray(5, 1 + len) }, size: 1 + len };
  };
  /** The one byte that answers an SSLRequest ('S' or 'N'). */
  const oneByte: Framing<Message> = (buf) => (buf.length >= 1 ? { value: { type: String.fromCharCode(buf[0]!), body: Buffer.alloc(0) }, size: 1 } : null);

  /** A raw client: reads messages as they come (the first byte alone when it is no typed message: 'S', 'N'). */
  const raw = async (opts: { login?: boolean; first?: Buffer[] } = {}) => {
    const { socket, next } = rawSocket(w.port);
    await new Promise<void>((r) => socket.once('connect', () => r()));
    /** The next message (type and body); the single byte of an SSLRequest answer with `single`; null once closed. */
    const read = (single = false) => next(single ? oneByte : pgMessage);
    /** Messages up to and including the next of `type`. */
    const until_ = async (type: string) => {
      const seen: Message[] = [];
      for (let m = await read(); m; m = await read()) {
        seen.push(m);
        if (m.type === type) return seen;
      }
      throw new Error(`closed before a '${type}' (saw ${seen.map((m) => m.type).join('')})`);
    };
    if (opts.login !== false) {
      socket.write(Buffer.concat([startup({ user: 'anyone', database: 'x', options: `pool=${w.sub}` }), password(), ...(opts.first ?? [])]));
      if (!opts.first) await until_('Z');
    }
    return { socket, read, until: until_ };
  };
  /** The fields of an ErrorResponse (C: SQLSTATE, M: message, S: severity), or null when `m` is none. */
  const errorOf = (m: Message | null) => {
    if (!m || m.type !== 'E') return null;
    const f = new Map<string, string>();
    for (let at = 0; at < m.body.length && m.body[at] !== 0; ) {
      const end = m.body.indexOf(0, at + 1);
      f.set(String.fromCharCode(m.body[at]!), m.body.toString('utf8', at + 1, end));
      at = end + 1;
    }
    return { code: f.get('C'), message: f.get('M'), severity: f.get('S') };
  };
  /** The first ErrorResponse among the next messages (others, such as a login's, skipped); null if none before the close. */
  const nextError = async (c: Awaited<ReturnType<typeof raw>>) => {
    for (let m = await c.read(); m; m = await c.read()) if (m.type === 'E') return errorOf(m);
    return null;
  };
  const closes = async (t: Test, c: Awaited<ReturnType<typeof raw>>) => {
    for (let m = await c.read(); m; m = await c.read()) t.fail(`nothing more after the error, got '${m.type}'`);
    t.pass('and the connection is closed');
  };
  /** Nothing held: no client, no link, no slot; every server connection idle, and PostgreSQL sees exactly those. */
  const nothingHeld = async (t: Test, what: string) => {
    await until(`${what}: the client gone and its slot back`, () => {
      const c = listener.counts();
      const g = governor.state(w.poolId);
      return c.clients === 0 && c.linked === 0 && g.inFlight === 0 && g.queued === 0;
    });
    t.pass(`${what}: no client, no link, no slot held or queued`);
    await until(`${what}: every server connection idle`, () => listener.counts().serversOpen === listener.counts().serversIdle);
    t.pass(`${what}: every server connection poolgate holds is idle`);
    await until(`${what}: no server connection leaked`, async () => (await w.backends()) === listener.counts().serversOpen);
    t.pass(`${what}: PostgreSQL sees exactly the server connections poolgate holds`);
  };
  /** Opens a transaction on `c` and inserts row `id` in it (uncommitted). */
  const insertInTransaction = async (c: Awaited<ReturnType<typeof raw>>, id: number) => {
    c.socket.write(Buffer.concat([query('BEGIN'), query(`INSERT INTO f VALUES (${id})`)]));
    await c.until('Z');
    await c.until('Z');
  };
  /**
   * The error `e` refused the message with `code` (as before the state machine) and says what the state
   * waited for (`pattern`); then the connection is closed and nothing it held is left held.
   */
  const refusedIn = async (t: Test, c: Awaited<ReturnType<typeof raw>>, state: string, e: ReturnType<typeof errorOf>, code: string, what: string, pattern: RegExp) => {
    t.equal(e?.code, code, what);
    t.match(e?.message, pattern, `says what was expected: ${e?.message}`);
    await closes(t, c);
    await nothingHeld(t, state);
  };
  const rows = async () => (await w.direct.query('SELECT id FROM f ORDER BY id')).rows.map((r: { id: number }) => r.id);

  t.test("state 'startup': a startup packet of protocol 2.0", async (t) => {
    const c = await raw({ login: false });
    c.socket.write(startup({ user: 'anyone' }, 0x00020000));
    await refusedIn(t, c, 'startup', await nextError(c), '0A000', 'feature not supported, as before', /unsupported frontend protocol 2\.0.*\(the session was waiting for a startup packet, SSLRequest, GSSENCRequest or CancelRequest\)/);
  });

  t.test("state 'tls': plaintext after the SSLRequest, before the TLS handshake", async (t) => {
    const c = await raw({ login: false });
    // Sent in one packet: what follows the SSLRequest could have been put there by anyone on the path.
    c.socket.write(Buffer.concat([sslRequest(), startup({ user: 'anyone', options: `pool=${w.sub}` })]));
    t.equal((await c.read(true))?.type, 'S', 'the SSLRequest is accepted');
    await refusedIn(t, c, 'tls', errorOf(await c.read()), '08P01', 'protocol violation, in plaintext', /unencrypted data after the SSLRequest \(the session was waiting for the TLS handshake\)/);
  });

  t.test("state 'password': a Query instead of the password message", async (t) => {
    const c = await raw({ login: false });
    c.socket.write(startup({ user: 'anyone', options: `pool=${w.sub}` }));
    t.equal((await c.read())?.type, 'R', 'asked for the password');
    c.socket.write(query('SELECT 1'));
    await refusedIn(t, c, 'password', await nextError(c), '08P01', 'protocol violation, as before', /expected a password message \(the session was waiting for a password message with the pool key\)/);
  });

  t.test("state 'joining': an unknown message type sent behind the password, before AuthenticationOk", async (t) => {
    // Session mode: the login takes a server connection before AuthenticationOk, so it is under way when the
    // message after the password is read.
    await w.patch({ settings: { wirePoolMode: 'session' } });
    t.teardown(() => w.patch({ settings: { wirePoolMode: null } }));
    const c = await raw({ first: [bogus()] });
    await refusedIn(t, c, 'joining', await nextError(c), '08P01', 'protocol violation', /invalid frontend message type 122 \(the session was waiting for the login to finish/);
  });

  t.test("state 'idle': an unknown message type between transactions never reaches a server connection", async (t) => {
    const c = await raw();
    const servers = listener.counts().serversOpen;
    c.socket.write(bogus());
    await refusedIn(t, c, 'idle', await nextError(c), '08P01', 'protocol violation (what PostgreSQL answers it)', /invalid frontend message type 122 \(the session was waiting for a Query, an extended-query batch, Sync or Terminate\)/);
    t.equal(listener.counts().serversOpen, servers, 'no server connection was used up');
  });

  t.test("state 'waiting': an unknown message type queued behind a Query that waits for the pool's one slot", async (t) => {
    const holder = await raw();
    holder.socket.write(query('BEGIN'));
    await holder.until('Z');
    t.equal(governor.state(w.poolId).inFlight, 1, 'another client holds the slot');
    const c = await raw();
    c.socket.write(Buffer.concat([query('SELECT 1'), bogus()]));
    const e = await nextError(c);
    t.equal(e?.code, '08P01', 'protocol violation');
    t.match(e?.message, /invalid frontend message type 122 \(the session was waiting for a slot and a server connection/, `says what was expected: ${e?.message}`);
    await closes(t, c);
    t.equal(governor.state(w.poolId).queued, 0, 'its place in the queue is given up');
    holder.socket.write(Buffer.concat([query('COMMIT'), message('X')]));
    await nothingHeld(t, 'waiting');
  });

  t.test("state 'active': an unknown message type inside a transaction; it is rolled back, its connection idle again", async (t) => {
    const c = await raw();
    await insertInTransaction(c, 1);
    t.equal(listener.counts().linked, 1, 'the transaction holds a server connection');
    const servers = listener.counts().serversOpen;
    c.socket.write(bogus());
    await refusedIn(t, c, 'active', await nextError(c), '08P01', 'protocol violation', /invalid frontend message type 122 \(the session was waiting for messages to pass to its server connection\)/);
    t.equal(listener.counts().serversOpen, servers, 'the server connection was kept (rolled back), not lost');
    t.same(await rows(), [], 'nothing committed');
  });

  t.test("state 'copyIn': a Query in the middle of COPY FROM STDIN; the copy is cut upstream", async (t) => {
    const c = await raw();
    c.socket.write(query('COPY f FROM STDIN'));
    t.equal((await c.read())?.type, 'G', 'CopyInResponse');
    c.socket.write(message('d', Buffer.from('7\n')));
    c.socket.write(query('SELECT 1'));
    await refusedIn(t, c, 'copyIn', await nextError(c), '08P01', 'protocol violation', /unexpected message type 0x51 during COPY from stdin \(the session was waiting for CopyData, CopyDone or CopyFail\)/);
    t.same(await rows(), [], 'nothing copied');
  });

  t.test("state 'skipping': an unknown message type in a batch refused here, before its Sync", async (t) => {
    await w.patch({ settings: { wireSessionState: 'refuse' } });
    t.teardown(() => w.patch({ settings: { wireSessionState: null } }));
    const c = await raw();
    await insertInTransaction(c, 2);
    // A temporary table is session state, which this pool refuses in transaction mode.
    const parse = message('P', Buffer.concat([cstr(''), cstr('CREATE TEMP TABLE t (a int)'), Buffer.from([0, 0])]));
    c.socket.write(Buffer.concat([parse, message('B', Buffer.concat([cstr(''), cstr(''), Buffer.from([0, 0, 0, 0, 0, 0])]))]));
    const refused = await nextError(c);
    t.equal(refused?.code, '0A000', 'the Parse is refused here');
    c.socket.write(bogus());
    await refusedIn(t, c, 'skipping', await nextError(c), '08P01', 'protocol violation', /invalid frontend message type 122 \(the session was waiting for the Sync that ends the refused batch\)/);
    t.same(await rows(), [], 'nothing committed');
  });
}
