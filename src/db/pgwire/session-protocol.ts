// The protocol-tracking part of a PostgreSQL client connection: client messages queued while there is no
// server connection and passed on once linked (frames as byte ranges of the chunk they came in; named
// prepared statements renamed, statements.ts); the answers owed (one per Sync or Query, Parse/Close
// completions), an extended-query batch left open, COPY FROM STDIN, a refused batch skipped to its Sync, and
// the transaction status read from ReadyForQuery, which ends a transaction mode link; the statements that
// create or remove session state (pinning.ts).
import { readyForQuery, query, errorFields } from './messages.js';
import { error, SQLSTATE } from './errors.js';
import { forgetUnreported, readParameterStatus } from './session-params.js';
import { ClientStatements, ExpectQueue, QUERY_END, SYNC } from './statements.js';
import type { Outbox } from './outbox.js';
import { NONE, PIN, PIN_REASONS, queryEffect, statementEffect, type Effect } from './pinning.js';
import { isFrontendType, unknownType } from './session-states.js';
import type { ConnWire } from './client-conn.js';
import type { Login } from './session-login.js';
import type { Link, LinkResult } from './session-link.js';

// Frame types (client → server).
const Q = 0x51, F = 0x46, P = 0x50, B = 0x42, D = 0x44, C = 0x43, E = 0x45, S = 0x53, H = 0x48, X = 0x58, CD = 0x64, CC = 0x63, CF = 0x66;
// Frame types (server → client).
const PARSE_COMPLETE = 0x31, CLOSE_COMPLETE = 0x33, READY = 0x5a, ERROR = 0x45, COPY_IN = 0x47, COMMAND_COMPLETE = 0x43, PARAMETER_STATUS = 0x53;

export class Protocol {
  readonly #wire: ConnWire;
  readonly #login: Login;
  readonly #link: Link;
  readonly #toClient: Outbox;
  readonly #toServer: Outbox;
  /** Client frames waiting for a link (states 'joining', 'waiting'; 'idle' and 'lost' for the moment a link takes). */
  #queue: Array<{ type: number; frame: Buffer }> = [];
  /** Responses still to come from the server: one entry per Parse/Close forwarded, and SYNC per Sync/Query. */
  readonly #expect = new ExpectQueue();
  #syncs = 0;
  /** The last frame forwarded left an extended-protocol batch open (no Sync yet). */
  #midBatch = false;
  /** A simple Query that removes session state when it succeeds: applied at its ReadyForQuery unless an error came. */
  #pendingClear: Effect | null = null;
  /** The server sent a FATAL error (terminated, shutting down), passed to the client: its close ends the client quietly. */
  serverFatal = false;
  readonly #statements: ClientStatements;
  constructor(wire: ConnWire, login: Login, link: Link, toClient: Outbox, toServer: Outbox) {
    this.#wire = wire;
    this.#login = login;
    this.#link = link;
    this.#toClient = toClient;
    this.#toServer = toServer;
    this.#statements = new ClientStatements(wire.ctx.maxPreparedStatements);
  }

  /** Answers are owed by the server connection, or a batch is open: it cannot be reused as it is. */
  get owed(): boolean {
    return this.#syncs > 0 || this.#midBatch;
  }

  /** The client is gone: nothing it queued is sent. */
  clear(): void {
    this.#queue.length = 0;
  }

  // ------------------------------------------------------------------------------- client → server

  /**
   * States 'idle', 'lost', 'joining', 'waiting' (no server connection): Sync, Flush and stray COPY messages
   * are answered here when nothing waits before them; anything else waits for a link (started from 'idle'
   * and 'lost'; 'joining' links once logged in).
   */
  unlinked(type: number, buf: Buffer, start: number, end: number): void {
    const w = this.#wire;
    if (!isFrontendType(type)) return w.illegal(SQLSTATE.protocolViolation, unknownType(type));
    // Terminate is ours to act on, never the server's.
    if (type === X && this.#queue.length === 0) return w.terminate(buf.subarray(start, end));
    const state = w.state;
    const linkable = state === 'idle' || state === 'lost';
    if (linkable && this.#queue.length === 0) {
      // Messages that need no server while unlinked.
      if (type === CD || type === CC || type === CF || type === H) return;
      if (type === S && state === 'idle') {
        w.send(readyForQuery('I'));
        return;
      }
    }
    if (state === 'idle' && this.#queue.length === 0) {
      // The usual start of a transaction: a slot and a server connection are free now, and the frame goes on
      // from its chunk like any linked one (never queued: no view, no queue entry made for it).
      const linked = this.#link.link();
      if (linked === true) {
        this.#linked();
        this.forward(type, buf, start, end);
        if (!w.inChunk) w.flushToServer();
        return;
      }
      this.#queue.push({ type, frame: buf.subarray(start, end) });
      if (this.#linkResult(linked)) this.linkAndDrain();
      return;
    }
    this.#queue.push({ type, frame: buf.subarray(start, end) });
    if (linkable) this.linkAndDrain();
  }

  /** State 'skipping': everything up to the refused batch's Sync is dropped; the Sync is answered here. */
  skip(type: number): void {
    const w = this.#wire;
    if (!isFrontendType(type)) return w.illegal(SQLSTATE.protocolViolation, unknownType(type));
    if (type === S) {
      w.enter(this.#link.server ? 'active' : 'idle');
      this.#localReady();
    } else if (type === X) w.end();
  }

  /** State 'copyIn': CopyData up to CopyDone or CopyFail (Flush and Sync pass too: the server ignores them). */
  copyIn(type: number, buf: Buffer, start: number, end: number): void {
    switch (type) {
      case CD:
      case H:
        return this.#toServer.addRange(buf, start, end);
      case S:
        // In copy-in the server ignores Sync (and answers nothing to it).
        this.#midBatch = false;
        return this.#toServer.addRange(buf, start, end);
      case CC:
      case CF:
        this.#wire.enter('active');
        return this.#toServer.addRange(buf, start, end);
      case X:
        return this.#wire.terminate(buf.subarray(start, end));
      default:
        // The server would answer an error and drop the message: its answers and ours would no longer pair up.
        return this.#wire.illegal(SQLSTATE.protocolViolation, isFrontendType(type) ? `unexpected message type 0x${type.toString(16)} during COPY from stdin` : unknownType(type));
    }
  }

  /**
   * State 'active': passes one client frame, bytes [start, end) of `buf`, on to the linked server, renaming
   * named prepared statements. Frames passed unchanged go as ranges of the chunk (no Buffer made for them).
   * (Terminate is the connection's: client-conn.ts.)
   */
  forward(type: number, buf: Buffer, start: number, end: number): void {
    switch (type) {
      case S:
        return this.#forwardBatchEnd(SYNC, buf, start, end);
      case Q: {
        const e = queryEffect(buf, start + 5, end - 1);
        if (e !== NONE && this.#sessionState(e, true)) return;
        return this.#forwardBatchEnd(QUERY_END, buf, start, end);
      }
      case F:
        return this.#forwardBatchEnd(QUERY_END, buf, start, end);
      case P:
      case B:
      case D:
      case C:
        return this.#forwardStatement(type, buf, start, end);
      case E:
        this.#midBatch = true;
        return this.#toServer.addRange(buf, start, end);
      case H:
      case CD:
      case CC:
      case CF:
        // Stray COPY messages outside COPY: the server ignores them, as the protocol says.
        return this.#toServer.addRange(buf, start, end);
      default:
        return this.#wire.illegal(SQLSTATE.protocolViolation, unknownType(type));
    }
  }

  /** Sync, a simple Query, a FunctionCall: each ends a batch, and the server answers it with a ReadyForQuery owed here. */
  #forwardBatchEnd(owed: typeof SYNC | typeof QUERY_END, buf: Buffer, start: number, end: number): void {
    this.#midBatch = false;
    this.#expect.push(owed);
    this.#syncs++;
    this.#toServer.addRange(buf, start, end);
  }

  /** Parse, Bind, Describe, Close: through the statement renaming (statements.ts), as ranges of the chunk. */
  #forwardStatement(type: number, buf: Buffer, start: number, end: number): void {
    const server = this.#link.server!;
    if (type === B) {
      this.#midBatch = true;
      const pins = this.#statements.forward(B, buf, start, end, server, this.#expect, this.#toServer);
      if (pins !== 0 && !this.#login.session) this.#link.pin(pins);
    } else if (type === P) {
      // The unnamed statement pins when parsed (its Bind follows in the same batch); a named one at each Bind.
      const named = buf[start + 5] !== 0;
      const nul = named ? buf.indexOf(0, start + 5) : start + 5;
      const e = nul >= 0 && nul < end ? statementEffect(buf, nul + 1, end) : NONE;
      if (e !== NONE && e.pins !== 0 && (!named || this.#refusing) && this.#sessionState(e, false)) return;
      this.#midBatch = true;
      this.#statements.forward(P, buf, start, end, server, this.#expect, this.#toServer, e.pins);
    } else {
      this.#midBatch = true;
      this.#statements.forward(type, buf, start, end, server, this.#expect, this.#toServer);
    }
  }

  /** The pool refuses session state in transaction mode (wireSessionState: 'refuse'). */
  get #refusing(): boolean {
    return !this.#login.session && this.#login.pool!.settings.wireSessionState === 'refuse';
  }

  /**
   * A statement that creates or removes session state is about to be forwarded. Transaction mode pins the
   * client (or, under wireSessionState 'refuse', answers it with 0A000 here and returns true: nothing ran).
   * A simple Query that removes state is noted, to unpin once it has succeeded outside any transaction.
   */
  #sessionState(e: Effect, query: boolean): boolean {
    if (e.pins !== 0 && !this.#login.session) {
      if (this.#refusing) return this.#refuseState(e.pins, query);
      this.#link.pin(e.pins);
    }
    if (query && (e.clears !== 0 || e.dropsPrepared || e.resetsSettings)) {
      // Only a Query alone on the wire, outside a transaction block: its one ReadyForQuery says whether it ran.
      this.#pendingClear = this.#syncs === 0 && !this.#midBatch && this.#link.server!.status === 'I' ? e : null;
    }
    return false;
  }

  /** wireSessionState 'refuse': the statement is answered 0A000 here and never reaches the server. */
  #refuseState(bits: number, query: boolean): true {
    const w = this.#wire;
    const kinds = PIN_REASONS.filter((r) => bits & PIN[r]).join(', ');
    const message =
      `pool ${this.#login.pool!.subdomain} refuses statements that create session state (${kinds}) in transaction mode ` +
      `(pool setting wireSessionState: 'refuse'); set wireSessionState to 'pin', or wirePoolMode to 'session'`;
    // Answers still owed ahead of it (a pipelining client): an answer of ours cannot be put in order.
    if (this.#syncs !== 0 || this.#midBatch) {
      w.fatal(SQLSTATE.featureNotSupported, message);
      return true;
    }
    w.send(error(SQLSTATE.featureNotSupported, message));
    if (query) this.#localReady();
    else w.enter('skipping');
    return true;
  }

  /**
   * A ReadyForQuery of ours for a batch that never reached the server: the server connection's transaction
   * status, and, in transaction mode, the link ends if that leaves nothing open.
   */
  #localReady(): void {
    const link = this.#link;
    const server = link.server;
    this.#wire.send(readyForQuery(server?.status ?? 'I'));
    // (While our SET's answers are still to come, its ReadyForQuery ends the link instead: #setupFrame.)
    if (server && link.transient && server.status === 'I' && this.#syncs === 0 && !this.#midBatch && link.setupAnswers === 0) this.#unlink();
  }

  // --------------------------------------------------------------------------------------- linking

  /**
   * Links and forwards the queued frames. A refused batch is answered and dropped, and the next queued
   * batch (if any) tries again: nothing is left queued without a link under way.
   */
  linkAndDrain(): void {
    const w = this.#wire;
    while (this.#queue.length > 0) {
      const state = w.state;
      if (state === 'lost') {
        w.enter('idle');
        this.#failBatch(error(SQLSTATE.upstreamLost, 'the server connection was lost; the transaction was rolled back'));
        continue;
      }
      if (state !== 'idle') return;
      if (!this.#linkResult(this.#link.link())) return;
    }
  }

  /**
   * Acts on a link() made for the first queued batch: linked (its frames forwarded), waiting for one, or
   * refused (the batch answered and dropped). true: the next queued batch, if any, must try again.
   */
  #linkResult(linked: LinkResult | Promise<LinkResult>): boolean {
    if (linked instanceof Promise) {
      this.#wire.enter('waiting');
      linked.then((r) => this.#waited(r)).catch(this.#wire.crashed);
      return false;
    }
    if (linked === true) {
      this.#linked();
      return false;
    }
    if (linked === null) return false;
    this.#failBatch(error(linked.code, linked.message));
    return true;
  }

  #waited(r: LinkResult): void {
    const w = this.#wire;
    if (w.state === 'closed') return;
    if (r === true) return this.#linked();
    if (r) this.#failBatch(error(r.code, r.message));
    if (w.state === 'waiting') w.enter('idle');
    this.linkAndDrain();
  }

  /** Linked from 'idle' or 'waiting': nothing is owed on the new server connection yet. */
  #linked(): void {
    this.#wire.enter('active');
    this.#expect.clear();
    this.#syncs = 0;
    this.drain();
  }

  /** Forwards the queued frames (each as its state takes it) while the link lasts. */
  drain(): void {
    const w = this.#wire;
    const server = this.#link.server;
    if (!server) return;
    while (this.#queue.length > 0 && this.#link.server === server) {
      const s = w.state;
      if (s !== 'active' && s !== 'copyIn' && s !== 'skipping') break;
      const { type, frame } = this.#queue.shift()!;
      w.message(type, frame, 0, frame.length);
    }
    // Linked while reading a chunk: the rest of it is forwarded too, then written in one go by the connection.
    if (!w.inChunk) w.flushToServer();
  }

  /** The transaction is over: the slot and server connection go back; frames queued meanwhile link again. */
  #unlink(): void {
    this.#link.unlink();
    this.#wire.enter('idle');
    if (this.#queue.length > 0) this.linkAndDrain();
  }

  /**
   * Answers the first pending batch with `err` without running it: a simple Query gets the error and
   * ReadyForQuery; an extended batch gets the error once and everything up to its Sync is dropped (state
   * 'skipping' when its Sync has not come yet).
   */
  #failBatch(err: Buffer): void {
    const w = this.#wire;
    w.logError('request refused', err);
    const first = this.#queue[0];
    if (!first) return;
    if (first.type === Q) {
      this.#queue.shift();
      w.send(Buffer.concat([err, readyForQuery('I')]));
      return;
    }
    w.send(err);
    while (this.#queue.length > 0) {
      const { type } = this.#queue.shift()!;
      if (type === S) {
        w.send(readyForQuery('I'));
        return;
      }
      if (type === X) return w.end();
    }
    w.enter('skipping');
  }

  /** The server connection was lost with nothing owed (the client sits in a transaction). */
  forgetOwed(): void {
    this.#expect.clear();
    this.#syncs = 0;
    this.#midBatch = false;
  }

  // ------------------------------------------------------------------------------- server → client

  /** One server frame, bytes [start, end) of `buf`: tracked, then passed to the client as a range. */
  serverFrame(type: number, buf: Buffer, start: number, end: number): void {
    const w = this.#wire;
    if (this.#link.setupAnswers > 0) return this.#setupFrame(type, buf.subarray(start, end));
    if (type === PARSE_COMPLETE || type === CLOSE_COMPLETE) {
      const e = this.#expect.peek();
      if (typeof e === 'object') {
        this.#expect.shift();
        if (e.drop) return;
      }
    } else if (type === READY) {
      if (this.#pendingClear !== null) this.#applyClear(this.#pendingClear);
      // Entries before this Sync never answered (an error skipped them): their statements were not prepared,
      // and those we closed are still there.
      let kept: Set<string> | null = null;
      while (this.#expect.size > 0) {
        const e = this.#expect.shift()!;
        if (typeof e !== 'object') break;
        if (e.closes) {
          this.#link.server?.prepared.add(e.closes);
          (kept ??= new Set()).add(e.closes);
        } else if (e.name && !kept?.has(e.name)) this.#link.server?.prepared.delete(e.name);
      }
      if (w.state === 'copyIn') w.enter('active');
      if (this.#syncs > 0) this.#syncs--;
    } else if (type === COPY_IN) {
      if (w.state === 'active') w.enter('copyIn');
      // An extended-protocol COPY: the Sync sent right after its Execute reaches the server in copy-in, which ignores it.
      if (this.#expect.dropFirstSync()) this.#syncs--;
    } else if (type === COMMAND_COMPLETE) {
      if (w.state === 'copyIn') w.enter('active');
    } else if (type === PARAMETER_STATUS) {
      // The client's own SET of a tracked parameter: it keeps that value in its later transactions too.
      const p = readParameterStatus(buf.subarray(start, end));
      if (p) this.#link.keepWanted(p.name, p.value);
    } else if (type === ERROR) {
      if (w.state === 'copyIn') w.enter('active');
      this.#pendingClear = null;
      // The server is going away (terminated 57P01, shutting down 57P02/57P03): the client gets the server's own
      // error, which drivers key failover on, and the close that follows ends the client.
      if (isFatal(buf, start, end)) this.serverFatal = true;
    }
    this.#toClient.addRange(buf, start, end);
    if (type !== READY || w.state === 'terminating') return;
    w.serverChunkEnd();
    // Not while an extended batch is open (Parse/Bind/… forwarded after the last Query or Sync, its Sync still
    // to come): that server connection has work of this client's in it, and after an error in it PostgreSQL
    // skips everything until a Sync — handed to another client, it would swallow that client's messages.
    if (this.#syncs !== 0 || this.#midBatch || buf[start + 5] !== 0x49 /* I */) return;
    // Out of any transaction: no portal is left that needs one of the statements used in it.
    this.#statements.transactionEnd();
    w.counted();
    if (this.#link.transient && w.state === 'active') this.#unlink();
  }

  /** A noted removal of session state succeeded: the client is unpinned from it, the connection's bookkeeping follows. */
  #applyClear(e: Effect): void {
    this.#pendingClear = null;
    const link = this.#link;
    const server = link.server;
    if (e.clears !== 0) link.unpin(e.clears);
    if (server && e.dropsPrepared) server.prepared.clear();
    if (server && e.resetsSettings) {
      server.resetUnreported();
      if (link.loginSql !== null) {
        link.setupAnswers++;
        server.write(query(link.loginSql));
      }
    }
  }

  /** An answer to our SET: swallowed; the server's spelling of each value is kept; an error ends the client. */
  #setupFrame(type: number, frame: Buffer): void {
    const link = this.#link;
    if (type === PARAMETER_STATUS) {
      const p = readParameterStatus(frame);
      if (p) link.keepWanted(p.name, p.value);
    } else if (type === ERROR) {
      link.setupError ??= frame;
    } else if (type === READY && --link.setupAnswers === 0 && !link.setupError) {
      // Everything the client sent on this link was answered here (a refused statement): the link ends now.
      const server = link.server;
      if (server && link.transient && this.#syncs === 0 && !this.#midBatch && server.status === 'I' && this.#wire.state === 'active') this.#unlink();
    } else if (type === READY && link.setupAnswers === 0 && link.setupError) {
      const f = errorFields(link.setupError);
      link.setupError = null;
      if (link.server) {
        forgetUnreported(link.server.params);
        link.server.settledFor = null;
      }
      this.#wire.fatal(f.get('C') ?? SQLSTATE.protocolViolation, `a session parameter given at login cannot be applied: ${f.get('M') ?? 'error'}`);
    }
  }
}

function isFatal(buf: Buffer, start: number, end: number): boolean {
  // Severity fields come first: 'S' then 'V' (non-localized); FATAL and PANIC end the connection.
  const text = buf.toString('latin1', start + 5, Math.min(end, start + 40));
  return /\0?[SV](FATAL|PANIC)\0/.test(`\0${text}`);
}
