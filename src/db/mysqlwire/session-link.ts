// The link part of a MySQL client session: a governor slot and a server connection from the upstream pool,
// taken for a command and given back when it ends, or held between commands (a transaction, session state,
// wirePoolMode 'session') and given back when that ends or the session closes; KILL ids mapped to the
// sessions they name. Every path that takes a slot or a connection gives both back exactly once (#settle,
// release()).
import { abortableOf, type Admission, type Permit } from '../../governor/governor.js';
import type { PoolEntry } from '../../pool-request/snapshot.js';
import { refusalReply } from '../../pool-request/refusal.js';
import type { DataplaneMetrics } from '../../pool-request/release.js';
import type { OutcomeName } from '../../pool-request/exchange.js';
import { STATUS, errPacket, okPacket } from './packets.js';
import { refusalError, wireError } from './wire-errors.js';
import { poolSignature } from './server-pool.js';
import { ServerLost, type Answer, type ServerConn } from './server-conn.js';
import type { ResponseKind } from './response-scanner.js';
import { STARTED, type Command } from './session-states.js';
import { PIN, PIN_MASK, PIN_REASONS } from './session-state.js';
import type { KillRequest } from './kill.js';
import type { Login } from './session-login.js';
import type { ClientSession, SessionWire } from './client-session.js';

const NO_HEADERS: Array<[string, string]> = [];

/**
 * A COM_QUERY's LOCAL INFILE exchange (session-protocol.ts): given the answer that asked for a file, relays
 * the client's file and resolves with the answer's end.
 */
export type Files = (conn: ServerConn, asked: Answer) => Promise<Answer>;

export class Link {
  readonly #wire: SessionWire;
  readonly #login: Login;
  /** wirePoolMode 'session': the first statement's server connection and slot stay with the client until it leaves. */
  sessionMode = false;
  /** The server connection held between commands (a transaction, session state, session mode), with its slot. */
  #held: ServerConn | null = null;
  /** The server connection a command is running on right now. */
  #running: ServerConn | null = null;
  #permit: Permit | null = null;
  /** The governor's grant behind #permit, recorded with the statement or transaction it admitted. */
  #admission: Admission | null = null;
  #heldSince = 0;
  #queuedMs = 0;
  #waited = false;
  /**
   * The two limits a session has, as times (performance.now() ms; 0 = none): the running command must end by
   * #commandBy (else it is killed upstream), and a held transaction must get its next command by #idleBy (else
   * it is rolled back). One timer checks both and is armed only when none is pending: a Timeout made and
   * cleared per statement (two in a transaction) cost more than the rest of a statement's bookkeeping.
   */
  #commandBy = 0;
  #idleBy = 0;
  #timer: NodeJS.Timeout | null = null;
  /** When #timer fires (performance.now() ms). */
  #timerAt = 0;
  /** The LOCAL INFILE exchange of the command start() runs, when the server may ask for a file. */
  #files: Files | null = null;
  /** Session state the client made on #held (session-state.ts PIN bits): it keeps #held and the slot while any is set. */
  #pins = 0;
  /** The slot held now was held pinned at some point: its hold time is no latency sample. */
  #heldPinned = false;
  readonly #abort = new AbortController();
  /** #abort as the governor takes it (made once per session, not per statement). */
  readonly #abortable = abortableOf(this.#abort.signal);

  constructor(wire: SessionWire, login: Login) {
    this.#wire = wire;
    this.#login = login;
  }

  #closed(): boolean {
    return this.#wire.state === 'closed';
  }

  /** Holding a slot and a server connection between commands. */
  get held(): ServerConn | null {
    return this.#held;
  }

  get pins(): number {
    return this.#pins;
  }

  /** The server status flags the client sees (its held connection's, else autocommit). */
  status(): number {
    return this.#held ? this.#held.status : STATUS.AUTOCOMMIT;
  }

  /** A command arrived: a held transaction is no longer idle. */
  active(): void {
    this.#idleBy = 0;
  }

  /** #timer fires by `at` (it may already be set to fire earlier; it re-arms itself for what is left). */
  #armBy(at: number): void {
    if (this.#timer !== null) {
      if (this.#timerAt <= at) return;
      clearTimeout(this.#timer);
    }
    this.#timerAt = at;
    this.#timer = setTimeout(this.#onTimer, Math.max(1, Math.ceil(at - performance.now())));
  }

  readonly #onTimer = (): void => {
    this.#timer = null;
    if (this.#closed()) return;
    const now = performance.now();
    const running = this.#running;
    if (running && this.#commandBy !== 0 && now >= this.#commandBy) {
      // The command ran past the pool's request timeout: it is killed upstream (once).
      this.#commandBy = 0;
      const pool = this.#login.pool;
      if (pool) void this.#wire.deps.servers.killQuery(pool, running);
    }
    if (!running && this.#idleBy !== 0 && now >= this.#idleBy) {
      this.#idleBy = 0;
      const ms = this.#login.pool!.settings.requestTimeoutMs;
      this.#wire.fail(0, 'idleInTransaction', `the transaction was idle for over ${ms} ms (the pool's request timeout) and was rolled back`);
      return;
    }
    const next = running ? this.#commandBy : this.#idleBy;
    if (next !== 0) this.#armBy(next);
  };

  /**
   * Runs one command on a server connection: the held one, or one taken (with a slot) for it. Afterwards both
   * are held while the server reports a transaction (or autocommit off) or the client has session state,
   * else given back.
   */
  async run(work: (conn: ServerConn) => Promise<Answer>): Promise<void> {
    const w = this.#wire;
    let conn = this.#held;
    if (conn && conn.clean) {
      // Pinned outside a transaction, maybe for long: the key and pool are checked at each statement still.
      const pool = this.#login.recheck();
      if (typeof pool === 'string') return w.fail(1, 'accessDenied', pool);
    }
    if (!conn) {
      const taken = this.#take();
      conn = taken instanceof Promise ? await taken : taken;
      if (!conn) return;
    }
    await this.#runOn(conn, work);
  }

  async #runOn(conn: ServerConn, work: (conn: ServerConn) => Promise<Answer>): Promise<void> {
    this.#begin(conn);
    try {
      await work(conn);
    } catch (err) {
      this.#commandBy = 0;
      if (!(err instanceof ServerLost)) throw err;
      this.#lost(err);
      return;
    }
    this.#end(conn);
  }

  /**
   * A command whose answer is only relayed: started at once (start()) on the held connection, or on one
   * taken now with a free slot and an idle connection, as an autocommit statement or a BEGIN takes them;
   * through run() when either must be waited for.
   */
  relay(cmd: Buffer, kind: ResponseKind, files: Files | null = null): Command {
    if (this.#held !== null) {
      const conn = this.ready();
      return conn ? this.start(conn, cmd, kind, files) : this.run(this.#relayWork(cmd, kind, files));
    }
    const taken = this.#take();
    if (taken instanceof Promise) return taken.then((conn) => (conn ? this.#runOn(conn, this.#relayWork(cmd, kind, files)) : undefined));
    return taken ? this.start(taken, cmd, kind, files) : undefined;
  }

  /** relay() as run() work, made only when a slot or a connection must be waited for (no closure on the direct path). */
  #relayWork(cmd: Buffer, kind: ResponseKind, files: Files | null): (conn: ServerConn) => Promise<Answer> {
    return files ? (c) => c.run(cmd, kind, this.#wire.sink, true).then((a) => files(c, a)) : (c) => c.run(cmd, kind, this.#wire.sink);
  }

  /**
   * The held connection when a command can start on it now, with nothing to wait for (no slot to take, no
   * connection to check out); null when run() must do it. Per statement inside a transaction this is the usual case.
   */
  ready(): ServerConn | null {
    const conn = this.#held;
    if (conn === null || !conn.alive || conn.busy) return null;
    // Pinned outside a transaction: the key and pool are checked at each statement (run() refuses it).
    if (conn.clean && typeof this.#login.recheck() === 'string') return null;
    return conn;
  }

  /**
   * run() without a promise or an await for a command that needs nothing from its answer: `cmd` goes to
   * `conn` (from ready()) now, its answer to the client, and the session hears that it ended through
   * wire.commandEnded(). Three promises and their reactions per statement cost more than the rest of its relay.
   */
  start(conn: ServerConn, cmd: Buffer, kind: ResponseKind, files: Files | null = null): typeof STARTED {
    this.#begin(conn);
    this.#files = files;
    conn.start(cmd, kind, this.#wire.sink, files !== null, this.#answered, this.#broke);
    return STARTED;
  }

  // Called from the server connection's read: a bug must cost this session, never the process (as a command's rejected promise does).
  readonly #answered = (a: Answer): void => {
    if (a.fileRequest && this.#files && this.#running) {
      // The server asks for a LOCAL INFILE file: the rest of the answer follows the client's file.
      this.#files(this.#running, a).then(this.#answered, this.#fileFailed);
      return;
    }
    try {
      const conn = this.#running;
      if (conn) this.#end(conn);
    } catch (err) {
      return this.#wire.commandFailed(err);
    }
    this.#wire.commandEnded();
  };

  readonly #fileFailed = (err: unknown): void => {
    if (err instanceof ServerLost) return this.#broke(err);
    this.#commandBy = 0;
    this.#wire.commandFailed(err);
  };

  readonly #broke = (err: ServerLost): void => {
    try {
      this.#commandBy = 0;
      this.#lost(err);
    } catch (e) {
      return this.#wire.commandFailed(e);
    }
    this.#wire.commandEnded();
  };

  /** A command starts on `conn`: it must end within the pool's request timeout, else it is killed upstream. */
  #begin(conn: ServerConn): void {
    this.#running = conn;
    this.#commandBy = performance.now() + this.#login.pool!.settings.requestTimeoutMs;
    this.#armBy(this.#commandBy);
  }

  /** The command's answer was relayed. */
  #end(conn: ServerConn): void {
    this.#commandBy = 0;
    this.#running = null;
    if (this.#closed()) return;
    this.#after(conn);
  }

  /** The command's server connection broke before its answer ended. */
  #lost(err: ServerLost): void {
    const w = this.#wire;
    this.#running = null;
    this.#held = null;
    // The client left mid-command (close() cut the server connection): nothing was lost upstream.
    if (this.#closed()) return;
    const hadState = this.#pins !== 0;
    this.unpin(PIN_MASK);
    this.#settle('upstream_aborted', 502);
    w.refused('upstream lost', 'lostConnection', 'lost connection to the database during the command');
    // Bytes of a result already went out: no clean ERR can follow them. In session mode the session is gone.
    if (err.forwarded) w.close();
    else if (this.sessionMode) w.fail(1, 'lostConnection', 'Lost connection to the database during the command; the session (wirePoolMode session) ended');
    else w.send(wireError(1, 'lostConnection', `Lost connection to the database during the command; any open transaction was rolled back${hadState ? ' and the session state (variables, temporary tables, locks) is gone' : ''}`));
  }

  /**
   * A slot and a server connection for a command: taken at once when the governor has a slot free and the
   * upstream pool an idle connection (no promise), else a promise that waits for them; null when refused (the
   * client was answered) or the session closed.
   */
  #take(): ServerConn | null | Promise<ServerConn | null> {
    const w = this.#wire;
    const pool = this.#login.recheck();
    if (typeof pool === 'string') {
      w.fail(1, 'accessDenied', pool);
      return null;
    }
    const signature = poolSignature(pool);
    if (signature === null) {
      w.refused('request refused', 'cannotConnect', 'the pool has no database role attached');
      w.send(wireError(1, 'cannotConnect', 'the pool has no database role attached'));
      return null;
    }
    const started = performance.now();
    const admission = w.deps.governor.acquire({ poolId: pool.id, waitMs: pool.settings.queueTimeoutMs, abortable: this.#abortable });
    if (admission instanceof Promise) return admission.then((a) => this.#admitted(pool, signature, started, a));
    return this.#admitted(pool, signature, started, admission);
  }

  /** The governor's answer: refused (the client is answered), or the slot, with a server connection to go with it. */
  #admitted(pool: PoolEntry, signature: string, started: number, admission: Admission): ServerConn | null | Promise<ServerConn | null> {
    const w = this.#wire;
    // Counted as queued only when the governor really queued it (a Redis answer is always a promise).
    this.#waited = admission.queued === true;
    this.#queuedMs = admission.queuedMs;
    if (!admission.ok) {
      // Counted as the HTTP data plane counts the same refusal (429, 504 queue timeout, 503 unavailable);
      // a client that left while queued gets nothing.
      const counted = refusalReply(admission, NO_HEADERS);
      if (!counted) {
        this.#record(pool, 'client_aborted', 0, admission);
        return null;
      }
      this.#record(pool, counted.error, counted.status, admission);
      w.refused('request refused', admission.reason, `no slot: ${admission.reason} after ${Math.round(performance.now() - started)} ms`);
      w.send(refusalError(1, admission.reason, pool.subdomain, performance.now() - started));
      return null;
    }
    if (this.#closed()) {
      admission.permit.release({ dropped: true });
      return null;
    }
    this.#permit = admission.permit;
    this.#admission = admission;
    this.#heldSince = performance.now();
    const idle = w.deps.servers.takeIdle(pool, signature, this.#login.variant, this.#login.collation);
    if (idle === null) return this.#connect(pool, signature);
    this.#held = idle;
    return idle;
  }

  /** A server connection for the slot just taken, when none waits idle (opened, or waited for). */
  async #connect(pool: PoolEntry, signature: string): Promise<ServerConn | null> {
    const w = this.#wire;
    let conn: ServerConn;
    try {
      conn = await w.deps.servers.checkout(pool, signature, this.#login.variant, this.#login.collation);
    } catch (err) {
      this.#settle('upstream_unreachable', 502);
      w.refused('upstream unreachable', 'cannotConnect', (err as Error).message);
      w.send(wireError(1, 'cannotConnect', `cannot reach the database: ${(err as Error).message}`));
      return null;
    }
    if (this.#closed()) {
      w.deps.servers.checkin(this.#login.pool ?? undefined, conn, true);
      this.#settle('client_aborted', 0);
      return null;
    }
    this.#held = conn;
    return conn;
  }

  /** After a command: the connection and slot held on (and why), or given back. */
  #after(conn: ServerConn): void {
    if (!conn.alive) {
      // Gone after its answer: whatever it held is gone with it.
      this.unpin(PIN_MASK);
    }
    if (this.sessionMode && conn.alive) {
      // wirePoolMode 'session': the client keeps its server connection (and slot) until it leaves, as if
      // connected to the database itself; the hold is no latency sample.
      this.#held = conn;
      this.#heldPinned = true;
      this.#keep(conn);
      return;
    }
    if (!conn.alive || (conn.clean && this.#pins === 0)) {
      this.#held = null;
      this.#wire.deps.servers.checkin(this.#login.pool ?? undefined, conn, true);
      this.#settle('proxied', 200);
    } else if (conn.clean) {
      // Pinned by session state outside a transaction: the connection and the slot stay with the client
      // until the state is gone or it leaves (no idle limit: the state is the client's to keep).
      this.#held = conn;
      this.#keep(conn);
    } else {
      // A transaction holds a slot: it may wait for its next statement at most the pool's request timeout.
      this.#idleBy = performance.now() + this.#login.pool!.settings.requestTimeoutMs;
      this.#armBy(this.#idleBy);
    }
  }

  /**
   * A server session kept for this client's state that the server ends between statements (wait_timeout,
   * a KILL from elsewhere, a restart) ends the client's session too, as a direct connection would end: its
   * state is gone, and the client learns it at once rather than at its next statement.
   */
  #keep(conn: ServerConn): void {
    const w = this.#wire;
    conn.onLostWhileKept = () => {
      if (this.#held !== conn || this.#running || this.#closed()) return;
      w.deps.log.info({ event: 'mysqlwire', outcome: 'server_session_ended', pool: this.#login.pool?.subdomain }, 'mysqlwire: the server ended a session kept for a client between statements; the client session ends too');
      w.ended('server_session_ended');
      this.#held = null;
      this.unpin(PIN_MASK);
      this.#settle('upstream_aborted', 502);
      w.close();
    };
  }

  /** COM_RESET_CONNECTION, COM_CHANGE_USER: the client's session state is dropped; a held connection goes back reset. */
  drop(): void {
    this.unpin(PIN_MASK);
    const conn = this.#held;
    if (conn) {
      this.#held = null;
      this.#wire.deps.servers.reset(this.#login.pool ?? undefined, conn);
      this.#settle('proxied', 200);
    }
  }

  /** The session closed: a running command's server connection is cut; a held one is rolled back and reset. */
  release(): void {
    this.#abort.abort();
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    this.#commandBy = 0;
    this.#idleBy = 0;
    const pool = this.#login.pool;
    const running = this.#running;
    const conn = this.#held;
    this.#held = null;
    if (running) {
      // The statement is stopped upstream too: a cut connection alone leaves it running on the server.
      if (pool && running.busy) void this.#wire.deps.servers.killQuery(pool, running, false);
      running.destroy();
    } else if (conn) {
      this.#wire.deps.servers.reset(pool ?? undefined, conn);
    }
    this.unpin(PIN_MASK);
    const clean = conn !== null && conn.clean && !running;
    this.#settle(clean ? 'proxied' : 'client_aborted', clean ? 200 : 0);
  }

  /** Gives the slot back (once) and counts the statement or transaction. */
  #settle(outcome: OutcomeName, status: number): void {
    const permit = this.#permit;
    if (!permit) return;
    this.#permit = null;
    const latencyMs = performance.now() - this.#heldSince;
    // A pinned hold lasts as long as the client keeps its state: no sample of how long the database takes.
    permit.release(outcome === 'proxied' && !this.#heldPinned ? { latencyMs } : { dropped: true });
    this.#heldPinned = false;
    const pool = this.#login.pool;
    if (pool) this.#record(pool, outcome, status, this.#admission, latencyMs);
    if (outcome === 'proxied') this.#wire.counted();
  }

  #record(pool: PoolEntry, outcome: OutcomeName, status: number, admission: Parameters<DataplaneMetrics['record']>[0]['admission'], upstreamMs: number | null = null): void {
    this.#wire.deps.metrics?.record({ poolId: pool.id, pool: pool.subdomain, status, outcome, admission, waited: this.#waited, queuedMs: this.#queuedMs, upstreamMs });
  }

  pin(bits: number): void {
    const added = bits & ~this.#pins;
    if (added === 0) return;
    this.#pins |= added;
    this.#heldPinned = true;
    this.#countPins(added, 1);
  }

  unpin(bits: number): void {
    const gone = bits & this.#pins;
    if (gone === 0) return;
    this.#pins &= ~gone;
    this.#countPins(gone, -1);
  }

  #countPins(bits: number, delta: 1 | -1): void {
    const m = this.#wire.deps.metrics;
    const pool = this.#login.pool;
    if (!m?.wirePinned || !pool) return;
    for (const reason of PIN_REASONS) if ((bits & PIN[reason]) !== 0) m.wirePinned(pool.subdomain, 'mysql', reason, delta);
  }

  /**
   * KILL [QUERY] <id>: `id` is a greeting id. Only the client's own sessions may be named: the same pool
   * logged in with the same key (the mariadb CLI's Ctrl-C and the connectors' destroy() send KILL from a
   * second connection with the same credentials), as a server lets a user kill only its own threads. Any
   * other id is 1094, as the server answers for a thread that does not exist. KILL QUERY stops the
   * statement the session is running (KILL QUERY upstream, from a separate server connection);
   * KILL [CONNECTION] ends the session (its statement killed upstream, its transaction rolled back).
   */
  kill(k: KillRequest, self: ClientSession): void {
    const w = this.#wire;
    if (k.kind === 'unmapped') {
      return w.send(wireError(1, 'notSupported', 'poolgate maps only KILL [CONNECTION | QUERY] <connection id>, sent alone; KILL USER, KILL QUERY ID and KILL inside PREPARE, EXECUTE IMMEDIATE or with other statements are not supported'));
    }
    const target = k.id === null ? self : w.deps.sessions.byId(k.id);
    if (!target || !target.ownedBy(self)) return w.send(wireError(1, 'unknownThread', `Unknown thread id: ${k.id}`));
    // KILL QUERY CONNECTION_ID() interrupts the KILL itself, as the server answers it.
    if (k.kind === 'query' && k.id === null) return w.send(errPacket(1, 1317, '70100', 'Query execution was interrupted'));
    if (k.kind === 'connection' && target === self) {
      // Its own connection: ended after ER_CONNECTION_KILLED, as the server does.
      w.ended('client_terminated');
      w.socket.end(errPacket(1, 1927, '70100', 'Connection was killed'));
      w.close();
      return;
    }
    if (k.kind === 'query') {
      target.link.killQuery();
      return w.send(okPacket(1, this.status()));
    }
    w.send(okPacket(1, this.status()));
    target.close();
  }

  /** Stops the statement running now, if any (its server connection is not reused: a late KILL QUERY could land on the next one). */
  killQuery(): void {
    const running = this.#running;
    const pool = this.#login.pool;
    if (running && pool) void this.#wire.deps.servers.killQuery(pool, running, false);
  }
}
