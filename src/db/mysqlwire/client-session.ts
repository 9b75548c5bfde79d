// One MySQL client connection, as a state machine (session-states.ts): the handshake (pool named by the
// user, the pool key as the password, checked with caching_sha2_password), then its commands one at a time.
// Three parts do the work, each with one job: Login (session-login.ts: handshake, auth, COM_CHANGE_USER),
// Link (session-link.ts: the slot and server connection, KILL ids) and Protocol (session-protocol.ts:
// commands, statements, LOCAL INFILE). The session owns the socket, reads packets only in states that
// read, hands each to the part its state names, and makes every transition through enter().
import type { WireLog } from '../wire-log.js';
import { TLSSocket, type SecureContext } from 'node:tls';
import type { Duplex } from 'node:stream';
import type { Socket } from 'node:net';
import type { Governor } from '../../governor/governor.js';
import type { Logger } from '../../log.js';
import type { SnapshotFeed } from '../../pool-request/snapshot.js';
import type { DataplaneMetrics } from '../../pool-request/release.js';
import type { Policies } from '../../policies/index.js';
import { FrameReader, type Packet } from './frame-reader.js';
import { wireError, type WireError } from './wire-errors.js';
import type { ServerPool } from './server-pool.js';
import type { ServerIdentity } from './server-identity.js';
import { directReads } from '../direct-reads.js';
import { DirectWriter } from '../direct-writes.js';
import type { Sink } from './server-conn.js';
import { replaying } from '../replay-stream.js';
import { STARTED, STATES, illegalPacket, legalTransition, type Command, type State } from './session-states.js';
import { Login } from './session-login.js';
import { Link } from './session-link.js';
import { Protocol } from './session-protocol.js';

/**
 * Largest client packet: 64 MiB (MySQL 8's default max_allowed_packet). One of 16 MiB or more comes split
 * and goes to the server split the same way; the server's own max_allowed_packet applies after this.
 */
export const MAX_CLIENT_PACKET = 64 << 20;
/** Largest login packet (a handshake response with connection attributes is well under this). */
const MAX_LOGIN_PACKET = 64 * 1024;

export interface SessionDeps {
  snapshots: SnapshotFeed;
  governor: Governor;
  servers: ServerPool;
  /** What the greeting announces (version, MariaDB capabilities). */
  identity: ServerIdentity;
  policies: Policies | null;
  metrics: DataplaneMetrics | null;
  clock: () => number;
  log: Logger;
  tls: SecureContext | null;
  /** Refusals and errors always, successful logins sampled (src/db/wire-log.ts). */
  wireLog?: WireLog;
  /** The listener's sessions by the id their greeting gave (KILL <id> is mapped through it). */
  sessions: { byId(id: number): ClientSession | undefined };
}

/** The session as its parts see it: its state, the socket, and what may be said or done to the client. */
export interface SessionWire {
  readonly id: number;
  readonly deps: SessionDeps;
  readonly state: State;
  readonly socket: Socket;
  /** Where forwarded answers go: the client connection's writer. */
  readonly sink: Sink;
  /** A command is pending (it may outlive state 'running' while a LOCAL INFILE file drains). */
  readonly inFlight: boolean;
  /** A command that answered STARTED (session-states.ts) ended; the next packets are read. */
  commandEnded(): void;
  /** A command that answered STARTED failed unexpectedly (a bug): the session is closed. */
  commandFailed(err: unknown): void;
  enter(to: State): void;
  /** Reads the packets waiting, as far as the state allows. */
  pump(): void;
  send(b: Buffer): void;
  /** An ERR, then the session is closed. */
  fail(seq: number, e: WireError, message: string): void;
  /** A packet not legal in this state: an ERR saying what the session waited for, then it is closed. */
  illegal(seq: number, e: WireError, what: string): void;
  /** A refusal for the wire log. */
  refused(what: string, code: string, message: string): void;
  /** Why the session ends, for its end line (the first reason given stands). */
  ended(reason: string): void;
  /** A statement or transaction given back as proxied (counted on the session's end line). */
  counted(): void;
  /** Logged in as `user` (login part): commands are read from now on. */
  loggedIn(user: string): void;
  /** The SSLRequest was taken: TLS from the next byte on. */
  upgrade(): void;
  /** COM_RESET_CONNECTION and COM_CHANGE_USER: statements and session state dropped, a held connection reset. */
  resetSession(): void;
  close(): void;
}

export class ClientSession {
  /** The connection id this client's greeting gave it (what it may name in KILL). */
  readonly id: number;
  readonly #deps: SessionDeps;
  readonly #onClose: (s: ClientSession) => void;
  #socket: Socket;
  /**
   * Writes to the client through the handle (direct-writes.ts): a server's answer and poolgate's own packets
   * go out without Node.js's Writable bookkeeping; after a TLS upgrade it writes through the TLS socket.
   */
  #writer: DirectWriter;
  #state: State = 'handshake';
  readonly #frames = new FrameReader(MAX_LOGIN_PACKET);
  /** A command is running (its promise, or one that answered STARTED and calls commandEnded). */
  #inFlight = false;
  /** A session whose login was logged, for its end line (src/db/wire-log.ts). */
  #logged: { start: number; user: string; peer: string; transactions: number; reason: string | undefined } | null = null;
  /** Where the TCP connection's bytes go: the packet reader, until a TLS upgrade takes them. */
  #fromTcp: (chunk: Buffer) => void = (c) => this.#onData(c);
  readonly #wire: SessionWire;
  readonly login: Login;
  readonly link: Link;
  readonly #protocol: Protocol;

  /** `accepted` must not be read yet (the listener accepts with pauseOnConnect): its reads are taken over here. */
  constructor(accepted: Socket, id: number, deps: SessionDeps, onClose: (s: ClientSession) => void) {
    this.id = id;
    this.#deps = deps;
    this.#onClose = onClose;
    const socket = directReads(accepted, (c) => this.#fromTcp(c));
    this.#socket = socket;
    this.#writer = new DirectWriter(socket);
    socket.setNoDelay(true);
    this.#attach(socket);
    this.#wire = this.#makeWire();
    this.login = new Login(this.#wire);
    this.link = new Link(this.#wire, this.login);
    this.#protocol = new Protocol(this.#wire, this.login, this.link, this);
  }

  #makeWire(): SessionWire {
    const s = this;
    return {
      id: this.id,
      deps: this.#deps,
      get state() { return s.#state; },
      get socket() { return s.#socket; },
      sink: { write: (b) => this.#writer.write(b), onDrain: (f) => void this.#socket.once('drain', f) },
      get inFlight() { return s.#inFlight; },
      commandEnded: this.#commandDone,
      commandFailed: this.#commandFailed,
      enter: (to) => this.#enter(to),
      pump: () => this.#pump(),
      send: (b) => this.#send(b),
      fail: (seq, e, message) => this.#fail(seq, e, message),
      illegal: (seq, e, what) => this.#fail(seq, e, illegalPacket(this.#state, what)),
      refused: (what, code, message) => this.#refused(what, code, message),
      ended: (reason) => {
        if (this.#logged) this.#logged.reason ??= reason;
      },
      counted: () => {
        if (this.#logged) this.#logged.transactions++;
      },
      loggedIn: (user) => this.#loggedIn(user),
      upgrade: () => this.#upgrade(),
      resetSession: () => {
        this.#protocol.forget();
        this.link.drop();
      },
      close: () => this.close(),
    };
  }

  get state(): State {
    return this.#state;
  }

  /** In a transaction or pinned by session state (holding a slot and a server connection between statements). */
  get pinned(): boolean {
    return this.link.held !== null;
  }

  /** Logged in and not closed, with the same pool and key as `other` (whose sessions KILL may name). */
  ownedBy(other: ClientSession): boolean {
    return (this.#state === 'idle' || this.#state === 'running' || this.#state === 'infile') && this.login.sameAccount(other.login);
  }

  /** The one place the state changes; a transition the table does not list is a bug, and ends the session. */
  #enter(to: State): void {
    if (!legalTransition(this.#state, to)) throw new Error(`mysql session: no transition from ${this.#state} to ${to}`);
    this.#state = to;
  }

  #onData(c: Buffer): void {
    this.#frames.push(c);
    this.#pump();
  }

  #attach(socket: Socket): void {
    socket.on('error', () => this.close());
    socket.on('close', () => this.close());
  }

  #pump(): void {
    while (STATES[this.#state].reads) {
      const p = this.#frames.next();
      if (!p) {
        if (this.#frames.oversized) {
          const limit = this.login.pool ? MAX_CLIENT_PACKET : MAX_LOGIN_PACKET;
          if (STATES[this.#state].login) this.#wire.illegal(0, 'badHandshake', `bad handshake: a packet larger than ${limit} bytes`);
          else this.#wire.illegal(0, 'packetTooLarge', `packet larger than ${limit} bytes`);
        }
        return;
      }
      let r: Command;
      try {
        r = this.#packet(p);
      } catch (err) {
        // A bug must cost this one connection, never the process.
        this.#deps.log.error({ err }, 'mysql listener: packet handling failed');
        this.close();
        return;
      }
      if (r === STARTED) {
        // Started on a held connection (session-link.ts start()): it calls commandEnded from the server's read.
        if (this.#state === 'idle') this.#enter('running');
        this.#inFlight = true;
      } else if (r instanceof Promise) {
        if (this.#state === 'idle') this.#enter('running');
        this.#inFlight = true;
        // One reaction per command (not .catch().finally(): a promise and a microtask more per statement).
        void r.then(this.#commandDone, this.#commandFailed);
      }
    }
  }

  readonly #commandDone = (): void => {
    this.#inFlight = false;
    if (this.#state === 'running') this.#enter('idle');
    this.#pump();
  };

  readonly #commandFailed = (err: unknown): void => {
    this.#deps.log.error({ err }, 'mysql listener: command failed unexpectedly');
    this.close();
    this.#commandDone();
  };

  /** A packet, to the part the state names. */
  #packet(p: Packet): Command {
    switch (this.#state) {
      case 'handshake':
        return this.login.handshake(p);
      case 'authSwitch':
        return this.login.authenticate(p.seq, p.payload);
      case 'changeUser':
        return this.login.changed(p.seq, p.payload);
      case 'infile':
        return this.#protocol.filePacket(p);
      case 'idle':
        // Every command starts a new exchange at sequence 0. Anything else is a desynchronised client (MariaDB
        // answers 1156 too): running it could execute bytes the client meant as something else, e.g. a
        // START TRANSACTION that commits the open transaction. The session is closed and its transaction rolled back.
        if (p.seq !== 0) return this.#wire.illegal((p.seq + 1) & 0xff, 'packetsOutOfOrder', `Got packets out of order: sequence id ${p.seq}`);
        return this.#protocol.command(p.payload);
      default:
        // 'running' and 'closed' read nothing (STATES[...].reads).
        throw new Error(`mysql session: a packet read in state ${this.#state}`);
    }
  }

  #loggedIn(user: string): void {
    this.#enter('idle');
    this.link.sessionMode = this.login.pool!.settings.wirePoolMode === 'session';
    this.#frames.limit = MAX_CLIENT_PACKET;
    const peer = this.#socket.remoteAddress ?? '';
    if (this.#deps.wireLog?.loggedIn({ pool: this.login.pool!.subdomain, peer, user })) {
      this.#logged = { start: performance.now(), user, peer, transactions: 0, reason: undefined };
    }
  }

  #upgrade(): void {
    const raw = this.#socket;
    raw.removeAllListeners('error');
    raw.removeAllListeners('close');
    // The TLS ClientHello may have come in the same read as the SSLRequest (mysql2 sends both at once):
    // then TLS runs over a stream that replays those bytes first and then the connection's, since a socket
    // wrapped directly is read below JavaScript and would never see them. Wrapped directly, TLS reads the
    // connection itself and nothing more comes through #fromTcp.
    const rest = this.#frames.drain();
    let under: Duplex | Socket = raw;
    if (rest) {
      const replay = replaying(raw, rest);
      this.#fromTcp = replay.push;
      under = replay.stream;
    } else this.#fromTcp = () => {};
    const secure = new TLSSocket(under, { isServer: true, secureContext: this.#deps.tls! });
    secure.on('data', (c: Buffer) => this.#onData(c));
    this.#socket = secure;
    this.#writer = new DirectWriter(secure);
    this.#attach(secure);
  }

  #refused(what: string, code: string, message: string): void {
    this.#deps.wireLog?.refused(what, { pool: this.login.pool?.subdomain ?? null, peer: this.#socket.remoteAddress ?? '', code, message });
  }

  #send(b: Buffer): void {
    if (this.#state !== 'closed') this.#writer.write(b);
  }

  /** An ERR, then the connection is closed (login failures, protocol errors). */
  #fail(seq: number, e: WireError, message: string): void {
    if (this.#state === 'closed') return;
    if (this.#logged) this.#logged.reason ??= `error ${e}`;
    this.#refused(STATES[this.#state].login ? 'login refused' : 'session ended', e, message);
    this.#socket.end(wireError(seq, e, message));
    this.close();
  }

  /** Ends the session: a running command's server connection is cut; a transaction is rolled back and its connection reset. */
  close(): void {
    if (this.#state === 'closed') return;
    this.#enter('closed');
    this.login.stop();
    this.#socket.destroy();
    this.link.release();
    this.#onClose(this);
    const s = this.#logged;
    if (s) {
      this.#deps.wireLog?.ended({
        pool: this.login.pool?.subdomain ?? null, peer: s.peer, user: s.user, durationMs: Math.round(performance.now() - s.start),
        bytesIn: this.#socket.bytesRead ?? 0, bytesOut: this.#socket.bytesWritten, transactions: s.transactions, reason: s.reason ?? 'client_disconnected',
      });
    }
  }
}
