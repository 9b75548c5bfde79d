// One client connection of the PostgreSQL listener, as a state machine (session-states.ts): the login
// (SSLRequest/TLS, startup, the pool key as a cleartext password), then pooling. In transaction mode a
// governor slot and a server connection are linked from the client's first message of a transaction until
// ReadyForQuery idle; in session mode, for the whole session. Three parts do the work, each with one job:
// Login (session-login.ts: startup, TLS and GSS negotiation, the key, the pool rechecked), Link
// (session-link.ts: the slot and server connection, pins, cancel keys, one release()) and Protocol
// (session-protocol.ts: batches, COPY, skipping to Sync, transaction status). The connection owns the
// sockets and the frame reader, hands each frame to the part its state names, and makes every transition
// through enter(). Frames pass through as byte ranges of the chunk they came in (direct-reads.ts,
// outbox.ts, direct-writes.ts): nothing is allocated per message on the linked path.
// performance from perf_hooks: the global one is a lazy getter run on every read.
import { performance } from 'node:perf_hooks';
import type { WireLog } from '../wire-log.js';
import { TLSSocket, type SecureContext } from 'node:tls';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { Governor } from '../../governor/governor.js';
import type { Logger } from '../../log.js';
import type { RequestRecord } from '../../pool-request/release.js';
import type { Snapshot } from '../../pool-request/snapshot.js';
import type { Policies } from '../../policies/index.js';
import { FrameReader, type FrameError } from './frames.js';
import { SSL_YES } from './messages.js';
import { fatal, SQLSTATE } from './errors.js';
import { MAX_STARTUP_BYTES } from './startup.js';
import type { ServerLink } from './server-conn.js';
import type { ServerPools } from './server-pool.js';
import { Outbox } from './outbox.js';
import { directReads } from '../direct-reads.js';
import { DirectWriter } from '../direct-writes.js';
import { replaying } from '../replay-stream.js';
import { STATES, illegalMessage, legalTransition, type State } from './session-states.js';
import { Login } from './session-login.js';
import { Link } from './session-link.js';
import { Protocol } from './session-protocol.js';

/** Where pinned clients are counted, by kind of session state. */
export interface PinMetrics {
  pinned(pool: string, reason: string): void;
  unpinned(pool: string, reason: string): void;
}

/** What the listener gives each client connection. */
export interface WireContext {
  snapshot(): Snapshot;
  governor: Governor;
  servers: ServerPools;
  poolDomain: string;
  /** The certificate offered on SSLRequest; null answers 'N'. */
  tls: SecureContext | null;
  maxMessageBytes: number;
  /** Named prepared statements kept per server connection (least recently used closed past it). */
  maxPreparedStatements: number;
  /** A login (startup to ReadyForQuery) must finish within this. */
  loginTimeoutMs: number;
  clock(): number;
  metrics: { record(r: RequestRecord): void } | null;
  pins: PinMetrics | null;
  /** The data plane's policies (the IP allowlist; HTTP-shaped ones refuse wire clients); null: none. */
  policies: Policies | null;
  /** Gives the client its BackendKeyData, and forgets it when it leaves. */
  register(client: ClientConn): { pid: number; secret: number };
  unregister(client: ClientConn): void;
  /** A CancelRequest arrived on this connection. */
  cancel(pid: number, secret: number): void;
  log: Logger;
  wireLog: WireLog;
}

const X = 0x58;

/** The first four bytes of a Terminate message ('X' 00 00 00) read as a startup packet's length. */
const TERMINATE_AS_LENGTH = 0x58000000;

/** Why the client's socket is paused (bits): a link or the login under way; the server not keeping up. */
const PAUSE_ACQUIRE = 1;
const PAUSE_SERVER_FULL = 2;

/** The connection as its parts see it: its state, the socket, and what may be said or done to the client. */
export interface ConnWire {
  readonly ctx: WireContext;
  readonly address: string;
  /** The connection, as the server connection it links to and the listener see it. */
  readonly self: ClientConn;
  readonly state: State;
  readonly socket: Socket;
  /** The frames of one received chunk are being handled: what they forward is written once, after the chunk. */
  readonly inChunk: boolean;
  enter(to: State): void;
  /** One client frame, handled as the state says (the protocol part replays queued frames through it). */
  message(type: number, buf: Buffer, start: number, end: number): void;
  /** Writes to the client, after the forwarded frames gathered before it. */
  send(bytes: Buffer): boolean;
  flushToServer(): void;
  /** A FATAL error, then the connection is closed. */
  fatal(code: string, message: string): void;
  fatalRaw(frame: Buffer): void;
  /** A message not legal in this state: a FATAL saying what the connection waited for, then it is closed. */
  illegal(code: string, what: string): void;
  /** Logs an error sent to the client. */
  logError(what: string, frame: Buffer): void;
  /** Closes the connection without a word (Terminate, CancelRequest). */
  end(): void;
  /** The client sent Terminate (client-conn.ts #terminate). */
  terminate(frame: Buffer): void;
  /** A fault of ours: this one connection ends (logged). */
  readonly crashed: (err: unknown) => void;
  /** Stops reading the client while a link (or the login) is under way; resume() reads again. */
  pause(): void;
  resume(): void;
  /** The server connection no longer holds the client back (unlinked). */
  serverWritable(): void;
  /** A ReadyForQuery went to the client's outbox: written now, or the server is held back. */
  serverChunkEnd(): void;
  /** A transaction ended (counted on the session's end line). */
  counted(): void;
  /** The login finished (AuthenticationOk sent): the client's messages are read, queued ones linked. */
  loggedIn(): void;
  /** An SSLRequest was accepted: TLS from the next byte on. */
  startTls(): void;
  /** The startup packet was read: frames are typed, and as large as messages may be, from here on. */
  readTyped(): void;
}

/** The wire as the connection itself keeps it. */
type Wire = { -readonly [K in keyof ConnWire]: ConnWire[K] };

export class ClientConn implements ServerLink {
  readonly #ctx: WireContext;
  readonly address: string;
  /** The TCP connection (under TLS, once the client asked for it): it closes when the client is gone. */
  readonly tcp: Socket;
  #socket: Socket;
  readonly #reader: FrameReader;
  #state: State = 'startup';
  #pause = 0;
  /** Some byte came before any TLS: a 0x16 later is no ClientHello. */
  #heardFirst = false;
  /** Direct TLS: where the connection's raw bytes go (the stream under the TLSSocket). */
  #direct: ((chunk: Buffer) => void) | null = null;
  /** Writes to #socket (replaced with it when TLS starts). */
  #writer!: DirectWriter;
  readonly #toClient = new Outbox((bytes) => this.#writer.write(bytes));
  readonly #toServer: Outbox;
  #transactions = 0;
  /** Why the session ended, for its end line; unset when the client just went away. */
  #endReason: string | undefined;
  /** What the parts see of the connection (its state, socket and whether a chunk is being read are kept current in it). */
  readonly #wire: Wire;
  readonly #login: Login;
  readonly #link: Link;
  readonly #protocol: Protocol;

  /** `accepted` must not be read yet (the listener accepts with pauseOnConnect): its reads are taken over here. */
  constructor(accepted: Socket, ctx: WireContext) {
    this.#ctx = ctx;
    this.address = accepted.remoteAddress ?? '';
    this.#reader = new FrameReader(MAX_STARTUP_BYTES, true);
    // After direct TLS starts, the connection's bytes go to the stream TLS reads (#directTls).
    const socket = directReads(accepted, (chunk) => (this.#direct ? this.#direct(chunk) : this.#onData(chunk)));
    this.tcp = socket;
    this.#socket = socket;
    socket.setNoDelay(true);
    this.#attach(socket);
    this.#wire = this.#makeWire();
    this.#login = new Login(this.#wire);
    const link = new Link(this.#wire, this.#login);
    this.#link = link;
    this.#login.link = link;
    this.#toServer = new Outbox((bytes) => link.server?.write(bytes) ?? true);
    this.#protocol = new Protocol(this.#wire, this.#login, link, this.#toClient, this.#toServer);
  }

  #makeWire(): Wire {
    // Plain data properties, written where they change, not getters: a getter in an object literal is a new
    // function per connection, which gives each connection's wire a shape of its own, and every part's read
    // of it turned megamorphic (a generic property lookup per read on the linked path).
    return {
      ctx: this.#ctx,
      address: this.address,
      self: this,
      state: this.#state,
      socket: this.#socket,
      inChunk: false,
      enter: (to) => this.#enter(to),
      message: (type, buf, start, end) => this.#onFrame(type, buf, start, end),
      send: (bytes) => this.#send(bytes),
      flushToServer: () => this.#flushToServer(),
      fatal: (code, message) => this.#fatal(code, message),
      fatalRaw: (frame) => this.#fatalRaw(frame),
      illegal: (code, what) => this.#fatal(code, illegalMessage(this.#state, what)),
      logError: (what, frame) => this.#logError(what, frame),
      end: () => this.#end(),
      terminate: (frame) => this.#terminate(frame),
      crashed: (err) => this.#crashed(err),
      pause: () => {
        this.#pause |= PAUSE_ACQUIRE;
        this.#socket.pause();
      },
      resume: () => this.#unpause(PAUSE_ACQUIRE),
      serverWritable: () => this.#unpause(PAUSE_SERVER_FULL),
      serverChunkEnd: () => this.onServerChunkEnd(),
      counted: () => {
        this.#transactions++;
      },
      loggedIn: () => this.#loggedIn(),
      startTls: () => this.#startTls(),
      readTyped: () => {
        this.#reader.untyped = false;
        this.#reader.maxFrameBytes = this.#ctx.maxMessageBytes;
      },
    };
  }

  get state(): State {
    return this.#state;
  }

  get linked(): boolean {
    return this.#link.server !== null;
  }

  get poolId(): number | null {
    return this.#login.pool?.id ?? null;
  }

  /** The client's BackendKeyData (the listener maps CancelRequests through it). */
  get pid(): number {
    return this.#link.pid;
  }

  get secret(): number {
    return this.#link.secret;
  }

  /** The one place the state changes; a transition the table does not list is a bug, and ends the connection. */
  #enter(to: State): void {
    if (!legalTransition(this.#state, to)) throw new Error(`pgwire connection: no transition from ${this.#state} to ${to}`);
    this.#state = to;
    this.#wire.state = to;
  }

  #attach(socket: Socket): void {
    this.#writer = new DirectWriter(socket);
    socket.on('drain', () => this.#link?.server?.resume());
    socket.on('error', () => this.#closed());
    socket.on('close', () => this.#closed());
  }

  #onData(chunk: Buffer): void {
    if (this.#state === 'closed') return;
    // A TLS ClientHello (record type 0x16) as the very first byte: direct TLS negotiation (PostgreSQL 17's
    // sslnegotiation=direct), with no SSLRequest before it.
    if (this.#state === 'startup' && !this.#heardFirst && chunk.length > 0 && chunk[0] === 0x16 && !(this.#socket instanceof TLSSocket)) return this.#directTls(chunk);
    if (chunk.length > 0) this.#heardFirst = true;
    const wire = this.#wire;
    wire.inChunk = true;
    let err: FrameError | null;
    try {
      err = this.#reader.push(chunk, this.#onFrame);
    } catch (e) {
      // A bug (a transition the table does not list, ...) must cost this one connection, never the process.
      wire.inChunk = false;
      return this.#crashed(e);
    }
    wire.inChunk = false;
    this.#flushToServer();
    if (err) this.#frameError(err);
  }

  /** One frame, to the part the state names (the linked path first: it is the one every message takes). */
  readonly #onFrame = (type: number, buf: Buffer, start: number, end: number): void => {
    switch (this.#state) {
      case 'active':
        // Terminate is ours to act on, never the server's.
        if (type === X) return this.#terminate(buf.subarray(start, end));
        return this.#protocol.forward(type, buf, start, end);
      case 'copyIn':
        return this.#protocol.copyIn(type, buf, start, end);
      case 'idle':
      case 'lost':
      case 'waiting':
      case 'joining':
        return this.#protocol.unlinked(type, buf, start, end);
      case 'skipping':
        return this.#protocol.skip(type);
      case 'startup':
        return this.#login.first(buf.subarray(start, end));
      case 'password':
        return this.#login.password(type, buf.subarray(start, end));
      case 'tls':
        // Bytes after the SSLRequest, in the same packet, before TLS was answered: never taken as the client's
        // (they could be injected by anyone on the path, CVE-2021-23214).
        return this.#illegalBeforeTls();
      case 'terminating':
      case 'closed':
        // After Terminate nothing more is read.
        return;
    }
  };

  /** Writes to the client, after the forwarded frames gathered before it. */
  #send(bytes: Buffer): boolean {
    this.#toClient.add(bytes);
    return this.#toClient.flush();
  }

  #flushToServer(): void {
    const server = this.#link.server;
    if (!this.#toServer.flush() && server && !server.closed) {
      // The server is not reading fast enough: stop reading the client until it drains.
      this.#pause |= PAUSE_SERVER_FULL;
      this.#socket.pause();
    }
  }

  #unpause(bit: number): void {
    if ((this.#pause & bit) === 0) return;
    this.#pause &= ~bit;
    if (this.#pause === 0 && this.#state !== 'closed') this.#socket.resume();
  }

  #frameError(err: FrameError): void {
    // A Terminate ('X', length 4) before any startup packet (node-postgres on connect(); end()): read untyped,
    // 'X\0\0\0' is a length of 0x58000000. PostgreSQL closes such a connection without a word.
    if (this.#state === 'startup' && err.declared === TERMINATE_AS_LENGTH) return this.#end();
    const message =
      err.kind === 'too_large'
        ? `message of ${err.declared} bytes exceeds the limit of ${this.#reader.maxFrameBytes} bytes`
        : `invalid message length ${err.declared}`;
    this.#fatal(SQLSTATE.protocolViolation, illegalMessage(this.#state, message));
  }

  // ------------------------------------------------------------------------------------------- TLS

  /**
   * Direct TLS: with a certificate, TLS starts on the bytes already read (the ClientHello), and the client
   * must choose ALPN `postgresql` as PostgreSQL 17 demands (a client that names another protocol gets TLS's
   * own no_application_protocol alert). Without one, the connection is closed at once, logged as what it
   * is: a TLS client cannot read a plaintext error.
   */
  #directTls(hello: Buffer): void {
    if (!this.#ctx.tls) {
      this.#ctx.wireLog.refused('login refused', { pool: null, peer: this.address, code: SQLSTATE.protocolViolation, message: 'direct TLS negotiation (sslnegotiation=direct), but the listener has no certificate (wireTlsCertFile)' });
      this.#socket.destroy();
      this.#closed();
      return;
    }
    this.#enter('tls');
    const raw = this.#socket;
    raw.removeAllListeners('error');
    raw.removeAllListeners('close');
    const replay = replaying(raw, hello);
    this.#direct = replay.push;
    const tls = this.#tlsOver(replay.stream, true);
    this.#socket = tls;
    this.#wire.socket = tls;
    this.#attach(tls);
  }

  /** The TLS server side over `under`; `direct`: ALPN `postgresql` is required. */
  #tlsOver(under: Duplex | Socket, direct: boolean): TLSSocket {
    const tls = new TLSSocket(under, { isServer: true, secureContext: this.#ctx.tls!, ALPNProtocols: ['postgresql'] });
    tls.on('data', (chunk: Buffer) => this.#onData(chunk));
    tls.on('secure', () => {
      if (direct && tls.alpnProtocol !== 'postgresql') {
        this.#ctx.wireLog.refused('login refused', { pool: null, peer: this.address, code: SQLSTATE.protocolViolation, message: 'direct TLS negotiation without ALPN postgresql' });
        tls.destroy();
        return;
      }
      const name = (tls as TLSSocket & { servername?: string | false }).servername;
      this.#login.servername = typeof name === 'string' ? name : null;
      if (this.#state === 'tls') this.#enter('startup');
    });
    return tls;
  }

  #startTls(): void {
    this.#enter('tls');
    const raw = this.#socket;
    raw.removeAllListeners('data');
    raw.write(SSL_YES);
    // TLS reads the connection's handle itself from here on: only the decrypted bytes reach #onData.
    const tls = this.#tlsOver(raw, false);
    this.#socket = tls;
    this.#wire.socket = tls;
    this.#attach(tls);
  }

  /** State 'tls': plaintext after the SSLRequest. The error goes out in plaintext too (TLS has not started). */
  #illegalBeforeTls(): void {
    const frame = fatal(SQLSTATE.protocolViolation, illegalMessage('tls', 'unencrypted data after the SSLRequest'));
    this.#endReason ??= `error ${SQLSTATE.protocolViolation}`;
    this.#logError('login refused', frame);
    this.tcp.end(frame);
    this.#closed();
  }

  // --------------------------------------------------------------------------------------- login done

  #loggedIn(): void {
    const session = this.#login.session;
    this.#enter(session ? 'active' : 'idle');
    this.#unpause(PAUSE_ACQUIRE);
    // Messages sent before AuthenticationOk (a pipelining client) waited: linked now.
    if (session) this.#protocol.drain();
    else this.#protocol.linkAndDrain();
  }

  // ------------------------------------------------------------------------------------ server link

  onServerFrame(type: number, buf: Buffer, start: number, end: number): void {
    this.#protocol.serverFrame(type, buf, start, end);
  }

  onServerChunkEnd(): void {
    // The client is not reading fast enough: stop reading the server until the client drains.
    if (!this.#toClient.flush()) this.#link.server?.pause();
  }

  onServerDrain(): void {
    this.#unpause(PAUSE_SERVER_FULL);
  }

  onServerClosed(): void {
    this.#toServer.clear();
    this.#link.dropped();
    const state = this.#state;
    if (state === 'closed') return;
    if (state === 'terminating') return this.#end();
    this.#unpause(PAUSE_SERVER_FULL);
    if (this.#protocol.serverFatal) return this.#end();
    if (this.#login.session) return this.#fatal(SQLSTATE.upstreamLost, 'the server connection was lost; the session ended');
    // Its session state (what pinned it) is gone with the connection: the client cannot go on as if it were not.
    if (this.#link.pins !== 0) return this.#fatal(SQLSTATE.upstreamLost, 'the server connection was lost, and with it this session\'s state (SET, temporary tables, LISTEN, locks); the session ended');
    const waiting = this.#protocol.owed;
    this.#protocol.forgetOwed();
    // A client waiting for answers cannot be told which of its statements ran: it is closed, as PostgreSQL would.
    if (waiting) return this.#fatal(SQLSTATE.upstreamLost, 'the server connection was lost while running this request; its transaction was rolled back');
    // The client sits inside a transaction and is not waiting: its next batch learns of the loss.
    this.#enter('lost');
  }

  /** Cancels the query running for this client (a CancelRequest naming its BackendKeyData). */
  cancelRunning(): void {
    this.#link.cancelRunning();
  }

  // --------------------------------------------------------------------------------------- teardown

  /** A fault of ours while serving this client: it ends this one connection (logged), never the process. */
  readonly #crashed = (err: unknown): void => {
    this.#ctx.log.error({ err }, 'pgwire: unexpected error; closing this client connection');
    this.#fatal(SQLSTATE.internalError, 'internal error in the PostgreSQL listener; the connection is closed');
  };

  #fatal(code: string, message: string): void {
    this.#fatalRaw(fatal(code, message));
  }

  /** Every error sent to the client is logged (the rare path: its fields are read back from the frame). */
  #logError(what: string, frame: Buffer): void {
    const text = frame.toString('utf8', 5);
    const field = (tag: string) => new RegExp(`\0${tag}([^\0]*)`).exec(`\0${text}`)?.[1];
    const code = field('C');
    // 57P01/57P03 at shutdown and a client that went away are not worth a warning each.
    if (code === SQLSTATE.cannotConnectNow) return;
    this.#ctx.wireLog.refused(what, { pool: this.#login.pool?.subdomain ?? null, peer: this.address, user: this.#login.user, code, message: field('M') });
  }

  #fatalRaw(frame: Buffer): void {
    if (this.#state === 'closed') return;
    this.#endReason ??= `error ${/\0C([^\0]*)/.exec(frame.toString('latin1', 5))?.[1] ?? ''}`.trim();
    this.#logError(STATES[this.#state].login ? 'login refused' : 'session ended', frame);
    this.#toClient.flush();
    this.#socket.end(frame);
    this.#closed();
  }

  #end(): void {
    this.#endReason ??= 'client_terminated';
    this.#toClient.flush();
    this.#socket.end();
    this.#closed();
  }

  /**
   * The client sent Terminate. With nothing owed by its server connection, the client ends here and the
   * connection is reset and reused (#closed). With answers still owed (a batch sent without waiting for
   * them, a COPY FROM STDIN), PostgreSQL would finish that batch before reading the Terminate: it goes to
   * the server, whose answers and close the client then gets, and that server connection is not reused.
   */
  #terminate(frame: Buffer): void {
    if (!this.#link.server || (!this.#protocol.owed && this.#state !== 'copyIn')) return this.#end();
    this.#enter('terminating');
    this.#pause |= PAUSE_ACQUIRE;
    this.#socket.pause();
    this.#toServer.add(frame);
    if (!this.#wire.inChunk) this.#flushToServer();
  }

  /** The client is gone: its server connection is cleaned (or closed) and its slot freed. Runs once. */
  #closed(): void {
    const state = this.#state;
    if (state === 'closed') return;
    // Work still owed (a batch without its answer, or a COPY FROM STDIN the server waits on): never reusable.
    const owed = this.#protocol.owed || state === 'copyIn' || state === 'terminating';
    this.#enter('closed');
    this.#login.stop();
    this.#ctx.unregister(this);
    this.#protocol.clear();
    this.#link.release(owed);
    if (!this.#socket.destroyed) this.#socket.destroySoon();
    const start = this.#login.loggedAt;
    if (start !== null) {
      this.#ctx.wireLog.ended({
        pool: this.#login.pool?.subdomain ?? null, peer: this.address, user: this.#login.user, durationMs: Math.round(performance.now() - start),
        bytesIn: this.#socket.bytesRead, bytesOut: this.#socket.bytesWritten, transactions: this.#transactions, reason: this.#endReason ?? 'client_disconnected',
      });
    }
  }

  /** Closes the connection now (listener shutdown). */
  terminate(message: string): void {
    this.#fatal(SQLSTATE.cannotConnectNow, message);
  }
}
