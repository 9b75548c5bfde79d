// The statement renaming of the PostgreSQL listener (statements.ts) and the Query scan of pinning.ts, on frames
// built here (no server): a Bind reaches the server under the upstream name of the statement the client named,
// byte for byte otherwise, also when the client prepares the name again, closes it, alternates names, or
// sends long portals and parameters (issue 30: the Bind path compares the last name's bytes instead of
// decoding it; these pin that it never binds a stale statement), also when each frame is a range of a larger
// chunk, as the listener hands it over without a view of its own. queryEffect finds a second statement after a
// ';' wherever it lies (the scan reads the first bytes itself, the rest through indexOf).
import t from 'tap';
import { ClientStatements, ExpectQueue, QUERY_END, SYNC, type Expect } from '../src/db/pgwire/statements.js';
import { PIN, queryEffect } from '../src/db/pgwire/pinning.js';
import type { ServerConn } from '../src/db/pgwire/server-conn.js';

const frame = (type: string, body: Buffer): Buffer => {
  const head = Buffer.alloc(5);
  head[0] = type.charCodeAt(0);
  head.writeInt32BE(4 + body.length, 1);
  return Buffer.concat([head, body]);
};
const cstr = (s: string) => Buffer.from(`${s}\0`);
const parse = (name: string, sql: string) => frame('P', Buffer.concat([cstr(name), cstr(sql), Buffer.from([0, 0])]));
/** A Bind of `stmt` into `portal` with `params` text parameters. */
const bind = (portal: string, stmt: string, params: string[] = []) => {
  const parts = [cstr(portal), cstr(stmt), Buffer.from([0, 0]), Buffer.from([params.length >> 8, params.length & 0xff])];
  for (const p of params) {
    const len = Buffer.alloc(4);
    len.writeInt32BE(Buffer.byteLength(p));
    parts.push(len, Buffer.from(p));
  }
  parts.push(Buffer.from([0, 0]));
  return frame('B', Buffer.concat(parts));
};
const close = (name: string) => frame('C', Buffer.concat([Buffer.from('S'), cstr(name)]));

/** Portal, statement name and what follows, read back from a Bind frame (its length field checked). */
function readBind(b: Buffer): { portal: string; stmt: string; rest: Buffer } {
  if (b[0] !== 0x42 || b.readInt32BE(1) !== b.length - 1) throw new Error(`not a whole Bind: ${b.toString('hex')}`);
  const p = b.indexOf(0, 5);
  const s = b.indexOf(0, p + 1);
  return { portal: b.toString('utf8', 5, p), stmt: b.toString('utf8', p + 1, s), rest: b.subarray(s + 1) };
}

/**
 * A client's statements. `chunked`: each frame is handed over as a range of a larger chunk (bytes of other
 * frames around it), as the listener reads them; a frame passed on unchanged must come out as that range.
 */
function session(chunked = false) {
  const statements = new ClientStatements(100);
  const server = { prepared: new Set<string>() } as unknown as ServerConn;
  const expect: Expect[] = [];
  let sent: Buffer[] = [];
  // A frame written in place (a renamed Bind) is filled before forward() returns: kept as its own Buffer.
  let reserved = Buffer.alloc(0);
  const out = {
    addRange: (buf: Buffer, start: number, end: number) => sent.push(Buffer.from(buf.subarray(start, end))),
    add: (bytes: Buffer) => sent.push(Buffer.from(bytes)),
    reserve: (n: number) => (sent.push((reserved = Buffer.alloc(n))), 0),
    get reserved() {
      return reserved;
    },
  };
  const send = (type: number, f: Buffer) => {
    sent = [];
    if (!chunked) statements.forward(type, f, 0, f.length, server, expect, out);
    else {
      const before = Buffer.from('S\0\0\0\x04D\0\0\0\x06P\0');
      const chunk = Buffer.concat([before, f, Buffer.from('E\0\0\0\x09\0\0\0\0\0')]);
      statements.forward(type, chunk, before.length, before.length + f.length, server, expect, out);
    }
    return sent;
  };
  /** Prepares `name` as `sql`: the upstream name it got. */
  const prepare = (name: string, sql: string): string => {
    const out = send(0x50, parse(name, sql));
    const p = out.at(-1)!;
    return p.toString('utf8', 5, p.indexOf(0, 5));
  };
  const bound = (portal: string, stmt: string, params?: string[]) => {
    const out = send(0x42, bind(portal, stmt, params));
    return readBind(out.at(-1)!);
  };
  return { send, prepare, bound };
}

for (const chunked of [false, true]) t.test(`a Bind names the upstream statement and keeps every other byte${chunked ? ' (frames as ranges of a chunk)' : ''}`, async (t) => {
  const s = session(chunked);
  const up = s.prepare('s1', 'SELECT $1::int');
  t.match(up, /^pgw_/);
  for (let i = 0; i < 3; i++) {
    const b = s.bound('', 's1', [String(i)]);
    t.equal(b.stmt, up);
    t.equal(b.portal, '');
    t.same(b.rest, readBind(bind('', 's1', [String(i)])).rest);
  }
  // A named portal and parameters longer than the loop's short runs.
  const long = 'x'.repeat(300);
  const b = s.bound('portal_1', 's1', [long, 'y']);
  t.equal(b.portal, 'portal_1');
  t.equal(b.stmt, up);
  t.same(b.rest, readBind(bind('portal_1', 's1', [long, 'y'])).rest);
});

for (const chunked of [false, true]) t.test(`the name prepared again, closed, or another name: never the statement bound before${chunked ? ' (frames as ranges of a chunk)' : ''}`, async (t) => {
  const s = session(chunked);
  const first = s.prepare('a', 'SELECT 1');
  t.equal(s.bound('', 'a').stmt, first);
  // Closed and prepared again with another text: the same bytes name another statement now.
  s.send(0x43, close('a'));
  const again = s.prepare('a', 'SELECT 2');
  t.not(again, first);
  t.equal(s.bound('', 'a').stmt, again);
  // Prepared again without a Close (PostgreSQL would refuse it; poolgate forwards it and renames).
  const third = s.prepare('a', 'SELECT 3');
  t.equal(s.bound('', 'a').stmt, third);
  // Two names of the same length, alternated.
  const b = s.prepare('b', 'SELECT 4');
  for (let i = 0; i < 3; i++) {
    t.equal(s.bound('', 'b').stmt, b);
    t.equal(s.bound('', 'a').stmt, third);
  }
  // A name that is a prefix of the last one, and a closed name: passed on as the client sent it.
  t.equal(s.bound('', 'ab').stmt, 'ab');
  s.send(0x43, close('b'));
  t.equal(s.bound('', 'b').stmt, 'b');
  t.equal(s.bound('', 'a').stmt, third);
});

t.test('queryEffect sees the statement after a ";" near or far', async (t) => {
  const q = (sql: string) => {
    const b = Buffer.from(`xx${sql}\0yy;SET search_path = x`);
    return queryEffect(b, 2, 2 + Buffer.byteLength(sql));
  };
  t.equal(q('SELECT 1').pins, 0, 'one statement; a ";" after the text is not read');
  t.equal(q('SELECT 1; SET search_path = a').pins, PIN.set);
  t.equal(q(`SELECT 1${' '.repeat(300)}; SET search_path = a`).pins, PIN.set, '";" past the first bytes');
  t.equal(q(`SELECT '${'z'.repeat(300)}';  `).pins, 0, 'a trailing ";" past the first bytes');
  t.equal(q(`SELECT 1; SELECT '${'z'.repeat(300)}'; CREATE TEMP TABLE x (a int)`).pins, PIN.temp_table, 'a third statement');
  // A lone SELECT is settled by one scan (plainSelect); whatever it cannot rule out goes to the full check.
  t.equal(q('SELECT abalance FROM pgbench_accounts WHERE aid = 1;').pins, 0, 'a plain SELECT with its trailing ";"');
  t.equal(q('  (SELECT 1) ;  \n').pins, 0, 'blanks and a parenthesis around it');
  t.equal(q('SELECT 1;SELECT pg_advisory_lock(1)').pins, PIN.advisory_lock, 'a call after the ";"');
  t.equal(q('select pg_advisory_lock(1);').pins, PIN.advisory_lock, 'a call in the SELECT itself');
  t.equal(q('SELECT * INTO TEMP t FROM x;').pins, PIN.temp_table, 'INTO TEMP');
  t.equal(q('SELECT 1; SET search_path = a;').pins, PIN.set, 'a SET after a plain SELECT');
});

t.test('ExpectQueue: first in, first out, over an array it reuses; a COPY drops the first Sync only', async (t) => {
  const q = new ExpectQueue();
  const parse = (name: string): Expect => ({ drop: false, name });
  for (let round = 0; round < 3; round++) {
    const a = parse(`a${round}`);
    q.push(a);
    q.push(SYNC);
    q.push(QUERY_END);
    t.equal(q.size, 3);
    t.equal(q.peek(), a);
    t.equal(q.shift(), a);
    t.equal(q.shift(), SYNC);
    // A new entry behind one still queued, in a slot used before.
    q.push(SYNC);
    t.equal(q.shift(), QUERY_END);
    t.equal(q.shift(), SYNC);
    t.equal(q.size, 0);
    t.equal(q.shift(), undefined);
    t.equal(q.peek(), undefined);
  }
  const b = parse('b');
  q.push(b);
  q.push(QUERY_END);
  t.equal(q.dropFirstSync(), false, 'the first end of a batch is a Query\'s: nothing dropped');
  q.clear();
  q.push(b);
  q.push(SYNC);
  q.push(QUERY_END);
  t.equal(q.dropFirstSync(), true);
  t.same([q.shift(), q.shift(), q.shift()], [b, QUERY_END, undefined], 'the entries around it kept, in order');
});
