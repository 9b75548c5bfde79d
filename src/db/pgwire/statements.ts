// Named prepared statements under transaction pooling (the scheme of pgbouncer 1.21): a client's statement
// is known upstream by a name derived from its query text and parameter types, so clients preparing the
// same query share it, and a server connection that has not seen it gets the client's Parse replayed
// first, its ParseComplete swallowed. Unnamed statements and portals pass through untouched. A server
// connection keeps at most `max` of them: past it, the least recently used one that no portal of the open
// transaction may need is closed (PgBouncer's max_prepared_statements); a client that uses it again gets it
// prepared again, transparently.
import { createHash } from 'node:crypto';
import { cstring } from './frames.js';
import { bindRenamed, closeStatement, describeStatement, parseNamed, type FrameRoom } from './messages.js';
import type { ServerConn } from './server-conn.js';

/**
 * A response the server still owes: a Parse or Close forwarded (its '1'/'3' is dropped when we injected
 * it; `name` is the statement it prepares), or the end of a batch, answered by one ReadyForQuery: a Sync
 * (SYNC), or a simple Query or FunctionCall (QUERY_END).
 */
export type Expect = { drop: boolean; name: string | null; closes?: string } | typeof SYNC | typeof QUERY_END;
export const SYNC = 0 as const;
export const QUERY_END = 1 as const;

/**
 * The responses still to come, oldest first: a FIFO over an array that never shrinks, read and written at
 * two indices. Array.shift() and writing `length` are each a call into the runtime, and a transaction made
 * both (an entry in, an entry out at its ReadyForQuery).
 */
export class ExpectQueue {
  readonly #items: Expect[] = [];
  #head = 0;
  #tail = 0;

  get size(): number {
    return this.#tail - this.#head;
  }

  push(e: Expect): void {
    const items = this.#items;
    if (this.#tail < items.length) items[this.#tail] = e;
    else items.push(e);
    this.#tail++;
  }

  /** The oldest entry; undefined when none. */
  peek(): Expect | undefined {
    return this.#head < this.#tail ? this.#items[this.#head] : undefined;
  }

  /** Takes the oldest entry; undefined when none. */
  shift(): Expect | undefined {
    if (this.#head === this.#tail) return undefined;
    const e = this.#items[this.#head++];
    if (this.#head === this.#tail) this.#head = this.#tail = 0;
    return e;
  }

  /** Removes the oldest end of a batch (SYNC or QUERY_END) if it is a SYNC: true when one was removed. */
  dropFirstSync(): boolean {
    const items = this.#items;
    for (let i = this.#head; i < this.#tail; i++) {
      const e = items[i]!;
      if (typeof e === 'object') continue;
      if (e !== SYNC) return false;
      items.copyWithin(i, i + 1, this.#tail);
      this.#tail--;
      if (this.#head === this.#tail) this.#head = this.#tail = 0;
      return true;
    }
    return false;
  }

  clear(): void {
    this.#head = this.#tail = 0;
  }
}

/** What statements.ts adds its expected responses to (an ExpectQueue). */
export interface Expecting {
  push(e: Expect): void;
}

const PASS: Expect = { drop: false, name: null };
/** Closing a name no server statement has: a CloseComplete in the right place, with no effect. */
const NO_STATEMENT = 'poolgate_none';

interface Statement {
  /** The client's name for it, as the bytes it sends (the Bind fast path compares them, decoding nothing). */
  client: Buffer;
  /** The upstream name: the same for every client preparing the same text and types. */
  server: string;
  /** The client's Parse body after its statement name: query text and parameter types. */
  rest: Buffer;
  /** `server` as a C string, ready to splice into each Bind. */
  serverC: Buffer;
  /** The session state its execution may create (pinning.ts): pins its client again at each Bind. */
  pins: number;
}

/** Where forwarded frames go (the server connection's outbox, outbox.ts): a range of the chunk it came in, bytes of our own, or a frame written in place. */
export interface StatementOut extends FrameRoom {
  addRange(buf: Buffer, start: number, end: number): void;
  add(bytes: Buffer): void;
}

/** Index of the first NUL in `b` from `at`, before `end`; -1 if none. A loop: names are a few bytes, and Buffer's indexOf is a call into C++ costing more than the scan. */
function nulAt(b: Buffer, at: number, end: number): number {
  for (let i = at; i < end; i++) if (b[i] === 0) return i;
  return -1;
}

/** Whether bytes [at, at + name.length) of `b` are `name`. */
function sameBytes(b: Buffer, at: number, name: Buffer): boolean {
  for (let i = 0; i < name.length; i++) if (b[at + i] !== name[i]) return false;
  return true;
}

function serverName(rest: Buffer): string {
  const digest = createHash('sha256').update(rest).digest('base64url').slice(0, 32);
  return `pgw_${digest}`;
}

export class ClientStatements {
  readonly #byName = new Map<string, Statement>();
  readonly #max: number;
  /** Server-side names used since the client's last ReadyForQuery idle: never evicted (their portals may be open). */
  readonly #inTransaction = new Set<string>();
  /**
   * The statement the last Bind named: a client running prepared statements binds the same few names over
   * and over (pgbench -M prepared, one), so the next Bind compares bytes instead of decoding a name and
   * looking it up. Cleared whenever a name is prepared again or closed.
   */
  #lastBound: Statement | null = null;

  constructor(max: number) {
    this.#max = max;
  }

  /** The client is out of any transaction: its statements may be evicted again. */
  transactionEnd(): void {
    if (this.#inTransaction.size > 0) this.#inTransaction.clear();
  }

  get size(): number {
    return this.#byName.size;
  }

  /**
   * Passes Parse, Bind, Describe or Close, bytes [start, end) of `buf` (header included), on to `out` (bound
   * for `server`), renamed and replayed as needed; a frame passed unchanged goes as its range of `buf`.
   * `pins`: for a Parse, the session state its statement may create; a Bind returns the pins of the named
   * statement it binds (0 otherwise), so a client is pinned whenever it runs it.
   */
  forward(type: number, buf: Buffer, start: number, end: number, server: ServerConn, expect: Expecting, out: StatementOut, pins = 0): number {
    switch (type) {
      case 0x50 /* P */: {
        // The unnamed statement (the name's first byte is its NUL) passes as is: no decoding on the common path.
        if (buf[start + 5] === 0) {
          expect.push(PASS);
          out.addRange(buf, start, end);
          return 0;
        }
        const name = cstring(buf, start + 5, end);
        if (!name) {
          expect.push(PASS);
          out.addRange(buf, start, end);
          return 0;
        }
        const rest = buf.subarray(name.next, end);
        const upstream = serverName(rest);
        const st: Statement = { client: Buffer.from(buf.subarray(start + 5, name.next - 1)), server: upstream, rest: Buffer.from(rest), serverC: Buffer.from(`${upstream}\0`), pins };
        this.#byName.set(name.value, st);
        this.#lastBound = null;
        if (server.prepared.has(st.server)) {
          // Already there (same text, same types): close and prepare again, so the client's ParseComplete comes in order.
          expect.push({ drop: true, name: null, closes: st.server });
          out.add(closeStatement(st.server));
          server.prepared.delete(st.server);
        }
        this.#add(st.server, server, expect, out);
        expect.push({ drop: false, name: st.server });
        out.add(parseNamed(st.server, st.rest));
        return 0;
      }
      case 0x42 /* B */: {
        // Unnamed portal of the unnamed statement: nothing to rename.
        if (buf[start + 5] === 0 && buf[start + 6] === 0) {
          out.addRange(buf, start, end);
          return 0;
        }
        const portalNul = nulAt(buf, start + 5, end);
        const stmtNul = portalNul < 0 ? -1 : nulAt(buf, portalNul + 1, end);
        const st = stmtNul > portalNul + 1 ? this.#bound(buf, portalNul + 1, stmtNul) : undefined;
        if (!st) {
          out.addRange(buf, start, end);
          return 0;
        }
        this.#ensure(st, server, expect, out);
        bindRenamed(out, buf, start, end, portalNul + 1, st.serverC, stmtNul + 1);
        return st.pins;
      }
      case 0x44 /* D */: {
        // A portal's Describe (libpq sends one with every prepared execution) passes as is.
        const st = buf[start + 5] === 0x53 /* S */ && buf[start + 6] !== 0 ? this.#named(buf, start, end) : undefined;
        if (!st) {
          out.addRange(buf, start, end);
          return 0;
        }
        this.#ensure(st, server, expect, out);
        out.add(describeStatement(st.server));
        return 0;
      }
      default: {
        // Close: a named statement is forgotten by this client only (others may share it upstream).
        expect.push(PASS);
        if (buf[start + 5] === 0x53 /* S */) {
          const name = cstring(buf, start + 6, end);
          if (name && name.value !== '') {
            this.#byName.delete(name.value);
            this.#lastBound = null;
            out.add(closeStatement(NO_STATEMENT));
            return 0;
          }
        }
        out.addRange(buf, start, end);
        return 0;
      }
    }
  }

  /** The statement named by bytes [at, nul) of a Bind (a non-empty name). */
  #bound(frame: Buffer, at: number, nul: number): Statement | undefined {
    const last = this.#lastBound;
    if (last !== null && last.client.length === nul - at && sameBytes(frame, at, last.client)) return last;
    const st = this.#byName.get(frame.toString('utf8', at, nul));
    if (st !== undefined) this.#lastBound = st;
    return st;
  }

  #named(buf: Buffer, start: number, end: number): Statement | undefined {
    const name = cstring(buf, start + 6, end);
    return name && name.value !== '' ? this.#byName.get(name.value) : undefined;
  }

  /** Replays the statement's Parse on a server connection that does not have it. */
  #ensure(st: Statement, server: ServerConn, expect: Expecting, out: StatementOut): void {
    if (server.prepared.has(st.server)) {
      // Most recently used last (a Set keeps insertion order).
      server.prepared.delete(st.server);
      server.prepared.add(st.server);
      this.#inTransaction.add(st.server);
      return;
    }
    this.#add(st.server, server, expect, out);
    expect.push({ drop: true, name: st.server });
    out.add(parseNamed(st.server, st.rest));
  }

  /** Records `name` as prepared on the connection, first closing the least recently used statements past the cap. */
  #add(name: string, server: ServerConn, expect: Expecting, out: StatementOut): void {
    if (server.prepared.size >= this.#max) {
      for (const old of server.prepared) {
        if (server.prepared.size < this.#max) break;
        // One this transaction used may back an open portal (closing a statement closes its portals).
        if (this.#inTransaction.has(old)) continue;
        server.prepared.delete(old);
        expect.push({ drop: true, name: null, closes: old });
        out.add(closeStatement(old));
      }
    }
    server.prepared.add(name);
    this.#inTransaction.add(name);
  }
}
