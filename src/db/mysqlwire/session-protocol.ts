// The protocol-tracking part of a MySQL client session: what each command is and how its answer is read,
// the client's prepared statements (ids of its own, prepared again on whichever server connection runs
// them; MariaDB's direct execute), long data, COM_STMT_BULK_EXECUTE, LOAD DATA LOCAL INFILE file packets, and
// which statements create or drop session state (the link holds the connection for those).
import type { Packet } from './frame-reader.js';
import { CLIENT, COM, STATUS, eofPacket, errPacket, frame, okPacket } from './packets.js';
import { wireError } from './wire-errors.js';
import type { Answer, ServerConn, ServerStatement } from './server-conn.js';
import { ClientStatement, LONG_DATA_LIMIT, longDataFor, prepareOk, remember } from './statements.js';
import type { ResponseKind } from './response-scanner.js';
import { CLEAR, DIRTY, PIN, PIN_MASK, sessionEffects } from './session-state.js';
import { killRequest, processKill } from './kill.js';
import type { Login } from './session-login.js';
import type { Link } from './session-link.js';
import type { ClientSession, SessionWire } from './client-session.js';
import type { Command } from './session-states.js';

/** MariaDB's COM_STMT_EXECUTE id for "the statement prepared just before" (pipelined prepare + execute). */
const LAST_PREPARED = 0xffffffff;

/** A LOCAL INFILE file on its way: the server connection that asked for it. */
interface InFile {
  conn: ServerConn;
  /** The empty packet that ends it went to the server. */
  sent: boolean;
  done: () => void;
}

export class Protocol {
  readonly #wire: SessionWire;
  readonly #login: Login;
  readonly #link: Link;
  readonly #self: ClientSession;
  readonly #statements = new Map<number, ClientStatement>();
  #nextStatement = 1;
  /** The id of the last COM_STMT_PREPARE that succeeded; 0 after one that failed (MariaDB's direct execute names it by LAST_PREPARED). */
  #lastPrepared = 0;
  /** State 'infile': where the client's file packets go. */
  #file: InFile | null = null;

  constructor(wire: SessionWire, login: Login, link: Link, self: ClientSession) {
    this.#wire = wire;
    this.#login = login;
    this.#link = link;
    this.#self = self;
  }

  /** State 'idle': one command (sequence id 0); a promise while it runs upstream. */
  command(p: Buffer): Command {
    const w = this.#wire;
    const pool = this.#login.pool!;
    this.#link.active();
    if (p.length === 0) return w.illegal(0, 'unknownCommand', 'empty command packet');
    switch (p[0]) {
      case COM.QUIT:
        w.ended('client_terminated');
        w.close();
        return;
      case COM.PING:
        w.send(okPacket(1, this.#link.status()));
        return;
      case COM.INIT_DB: {
        const db = p.toString('utf8', 1);
        // Back to the pool's database after a USE elsewhere: the server connection has to hear it.
        if (db === pool.database!.name && (this.#link.pins & PIN.use_database) !== 0) return this.#forward(p, 'single', CLEAR.use_database);
        if (db === pool.database!.name) w.send(okPacket(1, this.#link.status()));
        else w.send(wireError(1, 'dbAccessDenied', `Access denied to database '${db}' (the pool's database is '${pool.database!.name}')`));
        return;
      }
      case COM.QUERY: {
        const kill = killRequest(p);
        if (kill) return this.#link.kill(kill, this.#self);
        const held = this.#link.held;
        const effects = sessionEffects(p, pool.database!.name, held !== null && !held.clean);
        if ((effects & PIN_MASK) !== 0 && pool.settings.wireSessionState === 'refuse') return this.#refuseState();
        const localFiles = (this.#login.variant & CLIENT.LOCAL_FILES) !== 0;
        // No state to track: relayed (with the client's file, when the server asks for one).
        if (effects === 0) return this.#link.relay(frame(0, p), 'result', localFiles ? this.#files : null);
        return this.#forward(p, 'result', effects, localFiles);
      }
      case COM.FIELD_LIST:
        return this.#forward(p, 'fields');
      case COM.STATISTICS:
        return this.#forward(p, 'single');
      case COM.STMT_PREPARE:
        return this.#prepare(p);
      case COM.STMT_EXECUTE:
        return this.#execute(p);
      case COM.STMT_BULK_EXECUTE:
        if (!this.#login.bulk) return w.send(wireError(1, 'unknownCommand', 'COM_STMT_BULK_EXECUTE without the bulk operations capability'));
        return this.#bulkExecute(p);
      case COM.STMT_SEND_LONG_DATA: {
        const st = p.length >= 7 ? this.#statement(p.readUInt32LE(1)) : undefined;
        // No answer is ever sent to long data; a bad one is reported by the execute.
        if (st) {
          st.longBytes += p.length;
          if (st.longBytes <= LONG_DATA_LIMIT) st.longData.push(Buffer.from(p));
        }
        return;
      }
      case COM.STMT_CLOSE:
        if (p.length >= 5) this.#statements.delete(p.readUInt32LE(1) === LAST_PREPARED ? this.#lastPrepared : p.readUInt32LE(1));
        return;
      case COM.STMT_RESET: {
        const st = p.length >= 5 ? this.#statement(p.readUInt32LE(1)) : undefined;
        if (!st) return w.send(wireError(1, 'unknownStatement', 'Unknown prepared statement handler given to mysqld_stmt_reset'));
        st.longData = [];
        st.longBytes = 0;
        w.send(okPacket(1, this.#link.status()));
        return;
      }
      case COM.SET_OPTION: {
        if (p.length < 3) return w.send(wireError(1, 'unknownCommand', 'malformed COM_SET_OPTION'));
        if (this.#link.held) return w.send(wireError(1, 'notSupported', 'COM_SET_OPTION inside a transaction or with session state (pinned) is not supported by poolgate'));
        const on = p.readUInt16LE(1) === 0;
        this.#login.variant = on ? this.#login.variant | CLIENT.MULTI_STATEMENTS : this.#login.variant & ~CLIENT.MULTI_STATEMENTS;
        w.send(eofPacket(1, this.#link.status()));
        return;
      }
      case COM.RESET_CONNECTION:
        w.resetSession();
        w.send(okPacket(1, STATUS.AUTOCOMMIT));
        return;
      case COM.PROCESS_KILL: {
        const kill = processKill(p);
        if (!kill) return w.send(wireError(1, 'unknownCommand', 'malformed COM_PROCESS_KILL'));
        return this.#link.kill(kill, this.#self);
      }
      case COM.CHANGE_USER:
        return this.#login.changeUser(p);
      case COM.STMT_FETCH:
        return w.send(wireError(1, 'notSupported', 'cursors (COM_STMT_FETCH) are not supported by poolgate'));
      default:
        // Binlog and replication commands, shutdown, process kill/info, debug, ...: refused without closing.
        return w.send(wireError(1, p[0]! <= 0x1f ? 'notSupported' : 'unknownCommand', `command 0x${p[0]!.toString(16)} is not supported by poolgate`));
    }
  }

  /** COM_RESET_CONNECTION, COM_CHANGE_USER: the client's statements are forgotten. */
  forget(): void {
    this.#lastPrepared = 0;
    this.#statements.clear();
  }

  /** A client statement by id; LAST_PREPARED names the one prepared just before (none when that prepare failed). */
  #statement(id: number): ClientStatement | undefined {
    return this.#statements.get(id === LAST_PREPARED ? this.#lastPrepared : id);
  }

  /** `localFiles`: a COM_QUERY of a client that announced CLIENT_LOCAL_FILES (the server may ask it for a file). */
  #forward(p: Buffer, kind: ResponseKind, effects = 0, localFiles = false): Promise<void> {
    const cmd = frame(0, p);
    const run = (conn: ServerConn) => (localFiles ? this.#query(conn, cmd) : conn.run(cmd, kind, this.#wire.sink));
    if (effects === 0) return this.#link.run(run);
    return this.#link.run((conn) => this.#tracked(conn, effects, run(conn)));
  }

  /**
   * A COM_QUERY that may load local files: each LOCAL INFILE request the server answers with was relayed to
   * the client (state 'infile'); its file packets, up to the empty one, go back to the same server connection,
   * and the server's answer goes on (OK or ERR, maybe more results).
   */
  async #query(conn: ServerConn, cmd: Buffer): Promise<Answer> {
    return this.#files(conn, await conn.run(cmd, 'result', this.#wire.sink, true));
  }

  /** From an answer that may ask for a LOCAL INFILE file: each file relayed, then the answer's end. */
  readonly #files = async (conn: ServerConn, asked: Answer): Promise<Answer> => {
    const w = this.#wire;
    let a = asked;
    while (a.fileRequest) {
      const rest = conn.follow(w.sink);
      const file: InFile = { conn, sent: false, done: () => {} };
      await new Promise<void>((done) => {
        file.done = done;
        this.#file = file;
        w.enter('infile');
        w.pump();
        // The answer ended before the client's file did (the server gave up, or the connection broke): the
        // connection, out of step, is not used again, and the rest of the file is swallowed (filePacket).
        rest.then(() => { if (!file.sent) conn.destroy(); }, () => {}).finally(done);
      });
      a = await rest;
    }
    return a;
  };

  /** State 'infile': one packet of the file, relayed as is; the empty one ends the file. */
  filePacket(p: Packet): void {
    const to = this.#file!;
    if (p.payload.length === 0) {
      this.#file = null;
      // Back to the command's answer, or to the next command when the server answered before the file ended.
      this.#wire.enter(this.#wire.inFlight ? 'running' : 'idle');
      if (!to.conn.alive) return;
      to.sent = true;
      to.conn.send(frame(p.seq, p.payload));
      to.done();
      return;
    }
    to.conn.send(frame(p.seq, p.payload));
  }

  /**
   * Runs a statement that creates or drops session state: its connection is marked for reset, and the client
   * is pinned to it before it runs (so nothing can take the connection away) and unpinned from what it
   * dropped once it succeeds. A statement that failed created nothing (unless several ran in one packet).
   */
  async #tracked(conn: ServerConn, effects: number, run: Promise<Answer>): Promise<Answer> {
    const link = this.#link;
    if ((effects & (PIN_MASK | DIRTY)) !== 0) conn.dirty = true;
    const before = link.pins;
    link.pin(effects & PIN_MASK);
    const a = await run;
    if (a.error) {
      if ((this.#login.variant & CLIENT.MULTI_STATEMENTS) === 0) link.unpin(link.pins & ~before);
    } else {
      if (effects & CLEAR.lock_tables) link.unpin(PIN.lock_tables);
      if (effects & CLEAR.get_lock) link.unpin(PIN.get_lock);
      if (effects & CLEAR.use_database) link.unpin(PIN.use_database);
    }
    return a;
  }

  /** wireSessionState 'refuse': the statement is not run, and nothing changes. */
  #refuseState(): void {
    this.#wire.send(
      wireError(1, 'notSupported', `this statement creates session state (a user variable, SET, a temporary table, a lock, USE, PREPARE), which pool ${this.#login.pool!.subdomain} refuses (its wireSessionState setting is 'refuse'; 'pin' keeps such a client on its server connection)`),
    );
  }

  async #prepare(p: Buffer): Promise<void> {
    const w = this.#wire;
    this.#lastPrepared = 0;
    if (killRequest(p)) return w.send(wireError(1, 'notSupported', 'KILL cannot be prepared through poolgate: send it as a query (KILL [QUERY] <connection id>)'));
    const payload = Buffer.from(p);
    await this.#link.run(async (conn) => {
      const a = await conn.run(frame(0, payload), 'prepare', null);
      const ok = a.error ? null : prepareOk(a.bytes!);
      if (ok) {
        const st = new ClientStatement(payload, ok.params, sessionEffects(payload, this.#login.pool!.database!.name, false));
        remember(conn, st.key, { id: ok.id, params: ok.params });
        const id = this.#nextStatement++;
        if (this.#nextStatement >= LAST_PREPARED) this.#nextStatement = 1;
        this.#statements.set(id, st);
        this.#lastPrepared = id;
        // The answer as the server sent it, with poolgate's statement id.
        a.bytes!.writeUInt32LE(id, 5);
      }
      w.send(a.bytes!);
      return a;
    });
  }

  #execute(p: Buffer): Command {
    const w = this.#wire;
    const st = p.length >= 10 ? this.#statement(p.readUInt32LE(1)) : undefined;
    if (!st) return w.send(wireError(1, 'unknownStatement', 'Unknown prepared statement handler given to mysqld_stmt_execute'));
    if ((p[5]! & 0x07) !== 0) return w.send(wireError(1, 'notSupported', 'cursors are not supported by poolgate: execute without a cursor type'));
    if (st.longBytes > LONG_DATA_LIMIT) {
      st.longData = [];
      st.longBytes = 0;
      return w.send(wireError(1, 'packetTooLarge', `long data over ${LONG_DATA_LIMIT} bytes`));
    }
    if ((st.effects & PIN_MASK) !== 0 && this.#login.pool!.settings.wireSessionState === 'refuse') return this.#refuseState();
    // Inside a transaction, prepared on the held connection already, no long data, no state to track: started
    // at once. Anything else (and parameters that do not fit) takes the general path.
    const conn = st.effects === 0 && st.longData.length === 0 ? this.#link.ready() : null;
    const server = conn?.statements.get(st.key);
    const exec = server ? st.executeFor(p, server.id, conn!.mariadb) : null;
    if (exec) return this.#link.start(conn!, exec, 'result');
    return this.#executeOnLink(p, st);
  }

  async #executeOnLink(p: Buffer, st: ClientStatement): Promise<void> {
    const w = this.#wire;
    // `p` is a view of bytes read (direct-reads.ts) that nothing writes again: executeFor frames a copy of it.
    await this.#link.run(async (conn) => {
      // Prepared on this connection already (the usual case): no await for it.
      const server = conn.statements.get(st.key) ?? (await this.#serverStatement(conn, st));
      if (!('id' in server)) return server;
      const exec = st.executeFor(p, server.id, conn.mariadb);
      if (!exec) {
        // Parameters that do not fit the statement: answered as the server answers them (ER_MALFORMED_PACKET).
        w.send(errPacket(1, 1835, 'HY000', 'Malformed communication packet'));
        return { error: true, status: conn.status, bytes: null };
      }
      for (const d of st.longData) conn.send(longDataFor(d, server.id));
      st.longData = [];
      st.longBytes = 0;
      const run = conn.run(exec, 'result', w.sink);
      return st.effects === 0 ? run : this.#tracked(conn, st.effects, run);
    });
  }

  /**
   * MariaDB's COM_STMT_BULK_EXECUTE (the connector's batch()): the client's statement id becomes the server
   * connection's, as for COM_STMT_EXECUTE; the rows of parameters travel as they are.
   */
  async #bulkExecute(p: Buffer): Promise<void> {
    const st = p.length >= 7 ? this.#statement(p.readUInt32LE(1)) : undefined;
    if (!st) return this.#wire.send(wireError(1, 'unknownStatement', 'Unknown prepared statement handler given to mysqld_stmt_bulk_execute'));
    if ((st.effects & PIN_MASK) !== 0 && this.#login.pool!.settings.wireSessionState === 'refuse') return this.#refuseState();
    await this.#link.run(async (conn) => {
      const server = await this.#serverStatement(conn, st);
      if (!('id' in server)) return server;
      // Framing copies the client's payload; the server's statement id goes into the copy.
      const cmd = frame(0, p);
      cmd.writeUInt32LE(server.id, 4 + 1);
      const run = conn.run(cmd, 'result', this.#wire.sink);
      return st.effects === 0 ? run : this.#tracked(conn, st.effects, run);
    });
  }

  /** `st` as prepared on `conn` (prepared there now if it is not yet); the server's answer, sent on, when that prepare fails. */
  async #serverStatement(conn: ServerConn, st: ClientStatement): Promise<ServerStatement | Answer> {
    const known = conn.statements.get(st.key);
    if (known) return known;
    const a = await conn.run(frame(0, st.prepare), 'prepare', null);
    const ok = a.error ? null : prepareOk(a.bytes!);
    if (!ok) {
      this.#wire.send(a.bytes!);
      return a;
    }
    const server = { id: ok.id, params: ok.params };
    remember(conn, st.key, server);
    return server;
  }
}
