// One client connection of the PostgreSQL listener: the login (SSLRequest/TLS, startup, the pool key as a
// cleartext password), then pooling. In transaction mode a governor slot and a server connection are linked
// from the client's first message of a transaction until ReadyForQuery idle; in session mode, for the whole
// session. Frames pass through as received, except named prepared statements, which are renamed per query
// text and replayed on server connections that have not seen them (see statements.ts).
// performance from perf_hooks: the global one is a lazy getter run on every read.
import { performance } from 'node:perf_hooks';
import type { WireLog } from '../wire-log.js';
import { TLSSocket, type SecureContext } from 'node:tls';
import type { Socket } from 'node:net';
import type { Admission, Governor, LazyAbortSignal, Permit } from '../../governor/governor.js';
import type { Logger } from '../../log.js';
import type { RequestRecord } from '../../pool-request/release.js';
import { liveKey } from '../../pool-request/authenticate.js';
import { refusalOutcome, refusalStatus } from '../../pool-request/refusal.js';
import type { PoolEntry, Snapshot } from '../../pool-request/snapshot.js';
import type { Policies } from '../../policies/index.js';
import { sha256Hex } from '../../security/tokens.js';
import { cstring, FrameReader, type FrameError } from './frames.js';
import { AUTH_CLEARTEXT, AUTH_OK, backendKeyData, errorFields, parameterStatus, query, readyForQuery, SSL_NO, SSL_YES } from './messages.js';
import { error, fatal, refusal, SQLSTATE } from './errors.js';
import { MAX_STARTUP_BYTES, poolFromServerName, poolFromUser, readFirstPacket, readOptions } from './startup.js';
import { forgetUnreported, loginSettingsSql, notASetting, readParameterStatus, reported, settingName, setupQuery, trackedName } from './session-params.js';
import type { ServerConn, ServerLink } from './server-conn.js';
import type { ServerPool, ServerPools } from './server-pool.js';
import { ClientStatements, type Expect, QUERY_END, SYNC } from './statements.js';
import { Outbox } from './outbox.js';
import { ALL_PINS, NONE, PIN, PIN_REASONS, queryEffect, statementEffect, type Effect } from './pinning.js';
import { directReads } from '../direct-reads.js';
import { DirectWriter } from '../direct-writes.js';
import { replaying } from '../replay-stream.js';
import type { Duplex } from 'node:stream';
import { LastCheck } from '../wire-recheck.js';

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

// Frame types (client → server).
const Q = 0x51, F = 0x46, P = 0x50, B = 0x42, D = 0x44, C = 0x43, S = 0x53, H = 0x48, X = 0x58, CD = 0x64, CC = 0x63, CF = 0x66, PW = 0x70;
// Frame types (server → client).
const PARSE_COMPLETE = 0x31, CLOSE_COMPLETE = 0x33, READY = 0x5a, ERROR = 0x45, COPY_IN = 0x47, COMMAND_COMPLETE = 0x43, PARAMETER_STATUS = 0x53;

/** The first four bytes of a Terminate message ('X' 00 00 00) read as a startup packet's length. */
const TERMINATE_AS_LENGTH = 0x58000000;

const PAUSE_ACQUIRE = 1;
const PAUSE_SERVER_FULL = 2;

type Phase = 'first' | 'tls' | 'password' | 'ready' | 'closed';

export class ClientConn implements ServerLink {
  readonly #ctx: WireContext;
  readonly address: string;
  /** The TCP connection (under TLS, once the client asked for it): it closes when the client is gone. */
  readonly tcp: Socket;
  #socket: Socket;
  readonly #reader: FrameReader;
  #phase: Phase = 'first';
  /** The user name the client gave (logged with its refusals; never checked). */
  #user: string | undefined;
  #servername: string | null = null;
  #loginTimer: NodeJS.Timeout | null;
  pid = 0;
  secret = 0;

  // Who the client is, once logged in.
  #pool: PoolEntry | null = null;
  /** The pool's name as the snapshot keys it. */
  #poolName = '';
  #keyHash = '';
  #session = false;
  #servers: ServerPool | null = null;
  /** Session parameters the client set at login (startup packet or options), by the server's spelling. */
  #fromClient = new Map<string, string>();
  /**
   * The tracked parameters every server connection must have for this client (session-params.ts). Never
   * changed in place (replaced), so a server connection can remember which map it already matches; clients
   * that set none share their pool's.
   */
  #wanted: ReadonlyMap<string, string> = new Map();
  /** ReadyForQuery answers still owed to a SET we sent ahead of the client's messages (swallowed). */
  #setupAnswers = 0;
  #setupError: Buffer | null = null;

  /** When the check that this client may still use its pool last passed (#currentPool). */
  readonly #lastCheck = new LastCheck();

  // The link: a slot and a server connection.
  #permit: Permit | null = null;
  #server: ServerConn | null = null;
  #linkedAt = 0;
  #admission: Admission | null = null;
  #waited = false;
  /** A link is being waited for (slot or server connection). */
  #acquiring = false;
  /** Aborts a slot wait when the client leaves (one per client: the governor drops its listener after each wait). */
  #abort: AbortController | null = null;
  /** What the governor checks: the client is gone; the AbortController only once a wait needs its signal. */
  readonly #abortable: LazyAbortSignal = ((conn: ClientConn) => ({
    get aborted() {
      return conn.#gone;
    },
    signal: () => (conn.#abort ??= new AbortController()).signal,
  }))(this);
  #linkStarted = 0;
  #queuedMs = 0;
  /** Client frames waiting for a link. */
  #queue: Array<{ type: number; frame: Buffer }> = [];
  /** Responses still to come from the server: one entry per Parse/Close forwarded, and SYNC per Sync/Query. */
  #expect: Expect[] = [];
  #syncs = 0;
  /** The last frame forwarded left an extended-protocol batch open (no Sync yet). */
  #midBatch = false;
  /** The server sent CopyInResponse and the client has not ended the copy yet. */
  #copyIn = false;
  /** After a refusal inside a batch: drop client frames until its Sync. */
  #skipping = false;
  /** The server connection was lost while the client sat in a transaction: its next batch gets the error. */
  #lostTransaction = false;
  /** The client's Terminate went to the server (answers were still owed): the server's close ends the client. */
  #terminating = false;
  /**
   * Session state this client made on its server connection (PIN bits, transaction mode): while any is held,
   * the client keeps the connection and its slot between transactions (pinning.ts).
   */
  #pins = 0;
  /**
   * Settings given at login that poolgate does not track (startup parameters, options -c): applied on the
   * client's first server connection by set_config, which pins the client there for good (a RESET ALL
   * returns them to their login values, as on PostgreSQL); null when none, or once applied.
   */
  #loginSettings: Map<string, string> | null = null;
  /** Those settings' set_config, sent again after the client's own RESET ALL / DISCARD ALL (which return to login values on PostgreSQL). */
  #loginSql: string | null = null;
  /** Pins no statement removes (settings given at login). */
  #stickyPins = 0;
  /** A simple Query that removes session state when it succeeds: applied at its ReadyForQuery unless an error came. */
  #pendingClear: Effect | null = null;
  /** The server sent a FATAL error (terminated, shutting down), passed to the client: its close ends the client quietly. */
  #serverFatal = false;
  #pause = 0;
  /** The frames of one received chunk are being handled: what they forward is written once, after the chunk. */
  #inChunk = false;
  readonly #statements: ClientStatements;
  /** Writes to #socket (replaced with it when TLS starts). */
  #writer!: DirectWriter;
  readonly #toClient = new Outbox((bytes) => this.#writer.write(bytes));
  readonly #toServer = new Outbox((bytes) => this.#server?.write(bytes) ?? true);
  /** The client frame being forwarded, as a view, and where it lies in its chunk (statements.ts passes it on or rewrites it). */
  #cur: Buffer | null = null;
  #curBuf: Buffer | null = null;
  #curStart = 0;
  #curEnd = 0;
  readonly #out = (bytes: Buffer) => {
    // Passed on unchanged: the chunk's own bytes, so it joins the run of its neighbours (no copy at the flush).
    if (bytes === this.#cur) this.#toServer.addRange(this.#curBuf!, this.#curStart, this.#curEnd);
    else this.#toServer.add(bytes);
  };

  /** `accepted` must not be read yet (the listener accepts with pauseOnConnect): its reads are taken over here. */
  constructor(accepted: Socket, ctx: WireContext) {
    this.#ctx = ctx;
    this.address = accepted.remoteAddress ?? '';
    this.#reader = new FrameReader(MAX_STARTUP_BYTES, true);
    this.#statements = new ClientStatements(ctx.maxPreparedStatements);
    // After direct TLS starts, the connection's bytes go to the stream TLS reads (#directTls).
    const socket = directReads(accepted, (chunk) => (this.#direct ? this.#direct(chunk) : this.#onData(chunk)));
    this.tcp = socket;
    this.#socket = socket;
    socket.setNoDelay(true);
    this.#attach(socket);
    this.#loginTimer = setTimeout(() => this.#fatal(SQLSTATE.protocolViolation, 'login timed out'), ctx.loginTimeoutMs);
    this.#loginTimer.unref();
  }

  /** Some byte came before any TLS: a 0x16 later is no ClientHello. */
  #heardFirst = false;
  /** Direct TLS: where the connection's raw bytes go (the stream under the TLSSocket). */
  #direct: ((chunk: Buffer) => void) | null = null;

  /** The client has gone (read through a getter: it changes across awaits). */
  /** When the logged login finished (null: this session's login was not logged, nor is its end). */
  #sessionStart: number | null = null;
  #transactions = 0;
  /** Why the session ended, for its end line; unset when the client just went away. */
  #endReason: string | undefined;

  get #gone(): boolean {
    return this.#phase === 'closed';
  }

  get linked(): boolean {
    return this.#server !== null;
  }

  get poolId(): number | null {
    return this.#pool?.id ?? null;
  }

  #attach(socket: Socket): void {
    this.#writer = new DirectWriter(socket);
    socket.on('drain', () => this.#server?.resume());
    socket.on('error', () => this.#closed());
    socket.on('close', () => this.#closed());
  }

  #onData(chunk: Buffer): void {
    if (this.#gone) return;
    // A TLS ClientHello (record type 0x16) as the very first byte: direct TLS negotiation (PostgreSQL 17's
    // sslnegotiation=direct), with no SSLRequest before it.
    if (this.#phase === 'first' && !this.#heardFirst && chunk.length > 0 && chunk[0] === 0x16 && !(this.#socket instanceof TLSSocket)) return this.#directTls(chunk);
    if (chunk.length > 0) this.#heardFirst = true;
    this.#inChunk = true;
    const err = this.#reader.push(chunk, this.#onFrame);
    this.#inChunk = false;
    this.#flushToServer();
    if (err) this.#frameError(err);
  }

  /** Writes to the client, after the forwarded frames gathered before it. */
  #send(bytes: Buffer): boolean {
    this.#toClient.add(bytes);
    return this.#toClient.flush();
  }

  #flushToServer(): void {
    if (!this.#toServer.flush() && this.#server && !this.#server.closed) {
      // The server is not reading fast enough: stop reading the client until it drains.
      this.#pause |= PAUSE_SERVER_FULL;
      this.#socket.pause();
    }
  }

  onServerChunkEnd(): void {
    // The client is not reading fast enough: stop reading the server until the client drains.
    if (!this.#toClient.flush()) this.#server?.pause();
  }

  #frameError(err: FrameError): void {
    // A Terminate ('X', length 4) before any startup packet (node-postgres on connect(); end()): read untyped,
    // 'X\0\0\0' is a length of 0x58000000. PostgreSQL closes such a connection without a word.
    if (this.#phase === 'first' && err.declared === TERMINATE_AS_LENGTH) return this.#end();
    const message =
      err.kind === 'too_large'
        ? `message of ${err.declared} bytes exceeds the limit of ${this.#reader.maxFrameBytes} bytes`
        : `invalid message length ${err.declared}`;
    this.#fatal(SQLSTATE.protocolViolation, message);
  }

  readonly #onFrame = (type: number, buf: Buffer, start: number, end: number): void => {
    switch (this.#phase) {
      case 'first':
        return this.#onFirst(buf.subarray(start, end));
      case 'password':
        return this.#onPassword(type, buf.subarray(start, end));
      case 'ready':
        return this.#onMessage(type, buf, start, end);
      default:
        // TLS handshake under way or closed: nothing else may arrive.
        return this.#fatal(SQLSTATE.protocolViolation, 'unexpected data');
    }
  };

  // ------------------------------------------------------------------------------------------- login

  #onFirst(packet: Buffer): void {
    const p = readFirstPacket(packet);
    switch (p.kind) {
      case 'bad':
        return this.#fatal(p.message.startsWith('unsupported') ? SQLSTATE.featureNotSupported : SQLSTATE.protocolViolation, p.message);
      case 'gssenc':
        this.#send(SSL_NO);
        return;
      case 'cancel':
        this.#ctx.cancel(p.pid, p.secret);
        return this.#end();
      case 'ssl':
        if (!this.#ctx.tls || this.#socket instanceof TLSSocket) {
          this.#send(SSL_NO);
          return;
        }
        return this.#startTls();
      case 'startup':
        return this.#onStartup(p.params);
    }
  }

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
    this.#phase = 'tls';
    const raw = this.#socket;
    raw.removeAllListeners('error');
    raw.removeAllListeners('close');
    const replay = replaying(raw, hello);
    this.#direct = replay.push;
    const tls = this.#tlsOver(replay.stream, true);
    this.#socket = tls;
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
      this.#servername = typeof name === 'string' ? name : null;
      this.#phase = 'first';
    });
    return tls;
  }

  #startTls(): void {
    this.#phase = 'tls';
    const raw = this.#socket;
    raw.removeAllListeners('data');
    raw.write(SSL_YES);
    // TLS reads the connection's handle itself from here on: only the decrypted bytes reach #onData.
    const tls = this.#tlsOver(raw, false);
    this.#socket = tls;
    this.#attach(tls);
  }

  #onStartup(params: Map<string, string>): void {
    this.#user = params.get('user');
    if (params.get('replication') && params.get('replication') !== 'false' && params.get('replication') !== 'off') {
      return this.#fatal(SQLSTATE.featureNotSupported, 'replication connections are not supported by poolgate');
    }
    const fromOptions = readOptions(params.get('options'));
    if ('error' in fromOptions) return this.#fatal(SQLSTATE.featureNotSupported, fromOptions.error);
    for (const [name, value] of params) {
      const tracked = trackedName(name);
      if (tracked) this.#fromClient.set(tracked, value);
      else if (!notASetting(name)) {
        // Never dropped silently: applied (pinning the client for it), or the login refused.
        if (!settingName(name)) return this.#fatal(SQLSTATE.featureNotSupported, `startup parameter ${JSON.stringify(name)} is not a configuration parameter name`);
        (this.#loginSettings ??= new Map()).set(name, value);
      }
    }
    // `-c` settings in options win, as they do on PostgreSQL.
    for (const [name, value] of fromOptions.settings) this.#fromClient.set(name, value);
    for (const [name, value] of fromOptions.others) (this.#loginSettings ??= new Map()).set(name, value);
    const snap = this.#ctx.snapshot();
    // SNI, then options; only when neither names a pool does `user` (otherwise ignored: sessions run as the pool's role).
    const sub = poolFromServerName(this.#servername, this.#ctx.poolDomain) ?? fromOptions.pool ?? poolFromUser(this.#user, snap.pools);
    if (!sub) {
      const how = `log in as user=<subdomain> (PGUSER), connect to <subdomain>.${this.#ctx.poolDomain} with TLS, or set options=pool=<subdomain> (PGOPTIONS='pool=<subdomain>')`;
      // An unknown user is refused as PostgreSQL refuses an unknown role (28000); it tells no more than options=pool= does.
      if (this.#user) return this.#fatal(SQLSTATE.invalidAuthorization, `no pool named: user ${JSON.stringify(this.#user)} is not a pool; ${how}`);
      return this.#fatal(SQLSTATE.rejectedEstablishment, `no pool named: ${how}`);
    }
    this.#poolName = sub.toLowerCase();
    const pool = snap.pools.get(this.#poolName);
    if (!pool) return this.#fatal(SQLSTATE.unknownPool, `pool ${JSON.stringify(sub)} does not exist`);
    if (pool.backend !== 'postgres') return this.#fatal(SQLSTATE.rejectedEstablishment, `pool ${pool.subdomain} is not a PostgreSQL pool`);
    this.#pool = pool;
    // The rest of this chunk may already hold the password: the same reader goes on, typed from here.
    this.#reader.untyped = false;
    this.#reader.maxFrameBytes = this.#ctx.maxMessageBytes;
    this.#phase = 'password';
    this.#send(AUTH_CLEARTEXT);
  }

  #onPassword(type: number, frame: Buffer): void {
    if (type !== PW) return this.#fatal(SQLSTATE.protocolViolation, 'expected a password message');
    const pw = cstring(frame, 5);
    if (!pw || pw.next !== frame.length) return this.#fatal(SQLSTATE.protocolViolation, 'malformed password message');
    const pool = this.#pool!;
    this.#keyHash = sha256Hex(pw.value);
    const refusal = this.#admissible(pool, this.#ctx.snapshot());
    if (refusal) return this.#fatalRaw(refusal);
    const servers = this.#ctx.servers.forPool(pool);
    if (typeof servers === 'string') return this.#fatal(SQLSTATE.rejectedEstablishment, `pool ${pool.subdomain}: ${servers}`);
    this.#servers = servers;
    this.#session = pool.settings.wirePoolMode === 'session';
    this.#phase = 'ready';
    this.#pause |= PAUSE_ACQUIRE;
    this.#socket.pause();
    this.#finishLogin(servers).catch(this.#crashed);
  }

  /**
   * Why this client may not use the pool now (a FATAL to send), or null, recorded in #lastCheck as a pass.
   * Checked at login and at a link when something it reads may have changed (#currentPool).
   */
  #admissible(pool: PoolEntry, snap: Snapshot): Buffer | null {
    const key = liveKey(snap.keys, this.#keyHash, pool.id, this.#ctx.clock());
    if (key === null) {
      return fatal(SQLSTATE.invalidPassword, `password authentication failed for pool ${pool.subdomain}: the password must be a live key of this pool`);
    }
    if (key.access !== 'write') return fatal(SQLSTATE.invalidAuthorization, 'read keys cannot open wire connections; use a write key');
    if (pool.status !== 'active') return fatal(SQLSTATE.rejectedEstablishment, `pool ${pool.subdomain} is suspended`);
    const r = this.#ctx.policies?.wireRefusal(pool, key, this.address, 'POSTGRES') ?? null;
    if (r === null) {
      this.#lastCheck.passed(snap, key.expiresAt);
      return null;
    }
    if (r.reason === 'needs_http') return fatal(SQLSTATE.invalidAuthorization, `pool ${pool.subdomain} requires ${r.policy}, which wire connections cannot carry`);
    return fatal(SQLSTATE.invalidAuthorization, 'this client address is not allowed on this pool');
  }

  async #finishLogin(servers: ServerPool): Promise<void> {
    // The first login of a pool opens a server connection: it proves the upstream works and gives the parameters.
    if (!servers.params) {
      try {
        const conn = await servers.acquire();
        servers.release(conn, 'none');
      } catch (err) {
        return this.#fatal(SQLSTATE.upstreamUnavailable, `cannot connect to the database of pool ${this.#pool!.subdomain}: ${(err as Error).message}`);
      }
      if (this.#gone) return;
    }
    this.#wanted = servers.wanted(this.#fromClient);
    if (this.#session) {
      const ok = await this.#link();
      if (!ok) return;
    }
    if (this.#gone) return;
    const keys = this.#ctx.register(this);
    this.pid = keys.pid;
    this.secret = keys.secret;
    const out = [AUTH_OK];
    // The server's parameters as this client will have them.
    for (const [k, v] of servers.params ?? []) if (reported(k)) out.push(parameterStatus(k, this.#wanted.get(k) ?? v));
    out.push(backendKeyData(this.pid, this.secret), readyForQuery('I'));
    this.#send(Buffer.concat(out));
    if (this.#loginTimer) clearTimeout(this.#loginTimer);
    this.#loginTimer = null;
    if (this.#ctx.wireLog.loggedIn({ pool: this.#pool!.subdomain, peer: this.address, user: this.#user })) this.#sessionStart = performance.now();
    this.#unpause(PAUSE_ACQUIRE);
  }

  // ----------------------------------------------------------------------------------------- pooling

  #onMessage(type: number, buf: Buffer, start: number, end: number): void {
    if (this.#skipping) {
      if (type === S) {
        this.#skipping = false;
        this.#localReady();
      } else if (type === X) this.#end();
      return;
    }
    // Terminate is ours to act on, never the server's (checked before the linked fast path).
    if (type === X && this.#queue.length === 0) return this.#terminate(buf.subarray(start, end));
    if (this.#server && this.#queue.length === 0) return this.#forward(type, buf, start, end);
    if (this.#queue.length === 0 && !this.#acquiring) {
      // Messages that need no server while unlinked.
      if (type === CD || type === CC || type === CF || type === H) return;
      if (type === S && !this.#lostTransaction) {
        this.#send(readyForQuery('I'));
        return;
      }
    }
    this.#queue.push({ type, frame: buf.subarray(start, end) });
    if (!this.#acquiring && !this.#server) this.#linkAndDrain();
  }

  /**
   * Links and forwards the queued frames. A refused batch is answered and dropped, and the next queued
   * batch (if any) tries again: nothing is left queued without a link under way.
   */
  #linkAndDrain(): void {
    while (this.#queue.length > 0 && !this.#server && !this.#acquiring && !this.#gone) {
      if (this.#lostTransaction) {
        this.#lostTransaction = false;
        this.#failBatch(error(SQLSTATE.upstreamLost, 'the server connection was lost; the transaction was rolled back'));
        continue;
      }
      const linked = this.#link();
      if (linked === true) return this.#drain();
      if (linked !== false) {
        linked.then((ok) => (ok ? this.#drain() : this.#linkAndDrain())).catch(this.#crashed);
        return;
      }
    }
  }

  #drain(): void {
    const server = this.#server;
    if (!server || this.#gone) return;
    while (this.#queue.length > 0 && this.#server === server) {
      const { type, frame } = this.#queue.shift()!;
      if (type === X) return this.#terminate(frame);
      this.#forward(type, frame, 0, frame.length);
    }
    // Linked while reading a chunk: the rest of it is forwarded too, then written in one go by #onData.
    if (!this.#inChunk) this.#flushToServer();
  }

  /**
   * Takes a slot and a server connection: synchronously when both are free (the common case), else a
   * promise, with the client paused meanwhile. On a refusal the pending batch gets the error and the client
   * stays connected (transaction mode) or is told FATAL (session mode, at login). True when linked.
   */
  #link(): boolean | Promise<boolean> {
    const pool = this.#currentPool();
    if (!pool) return false;
    this.#linkStarted = performance.now();
    const admission = this.#ctx.governor.acquire({ poolId: pool.id, waitMs: pool.settings.queueTimeoutMs, abortable: this.#abortable });
    const linked = admission instanceof Promise ? admission.then((a) => this.#admitted(pool, a)) : this.#admitted(pool, admission);
    if (!(linked instanceof Promise)) return linked;
    this.#acquiring = true;
    this.#pause |= PAUSE_ACQUIRE;
    this.#socket.pause();
    return linked.finally(() => {
      this.#acquiring = false;
      if (!this.#gone) this.#unpause(PAUSE_ACQUIRE);
    });
  }

  #admitted(pool: PoolEntry, admission: Admission): boolean | Promise<boolean> {
    this.#admission = admission;
    // Queued only when the governor really queued it (a Redis answer is always a promise).
    this.#waited = admission.queued === true;
    if (!admission.ok) {
      this.#record(pool, refusalOutcome(admission.reason), refusalStatus(admission.reason), null);
      if (this.#gone) return false;
      const r = refusal(admission.reason, pool.subdomain, pool.settings.queueTimeoutMs);
      if (this.#session) this.#fatal(r.code, r.message);
      else this.#failBatch(error(r.code, r.message));
      return false;
    }
    const permit = admission.permit;
    if (this.#gone) {
      permit.release({ dropped: true });
      return false;
    }
    const got = this.#servers!.acquire();
    if (!(got instanceof Promise)) return this.#attachServer(pool, permit, got);
    return got.then(
      (server) => this.#attachServer(pool, permit, server),
      (err: unknown) => {
        permit.release({ dropped: true });
        this.#record(pool, 'upstream_unreachable', 503, null);
        if (this.#gone) return false;
        const message = `cannot connect to the database of pool ${pool.subdomain}: ${(err as Error).message}`;
        if (this.#session) this.#fatal(SQLSTATE.upstreamUnavailable, message);
        else this.#failBatch(error(SQLSTATE.upstreamUnavailable, message));
        return false;
      },
    );
  }

  #attachServer(pool: PoolEntry, permit: Permit, server: ServerConn): boolean {
    if (this.#gone || server.closed) {
      permit.release({ dropped: true });
      if (!server.closed) this.#servers!.release(server, 'none');
      else if (!this.#gone) this.#failBatch(error(SQLSTATE.upstreamLost, 'the server connection was lost before the transaction started'));
      return false;
    }
    this.#pool = pool;
    this.#permit = permit;
    this.#server = server;
    // Linked in the same call as #link started (no wait): the same instant, without a second clock read.
    this.#linkedAt = this.#acquiring ? performance.now() : this.#linkStarted;
    this.#queuedMs = this.#linkedAt - this.#linkStarted;
    server.link = this;
    this.#copyIn = false;
    // Setting an array's length is a runtime call even when it is already 0.
    if (this.#expect.length !== 0) this.#expect.length = 0;
    this.#syncs = 0;
    if (this.#loginSettings !== null) {
      // Once, on the first server connection: the client stays on it for the rest of its session.
      const sql = loginSettingsSql(this.#loginSettings);
      this.#loginSettings = null;
      this.#loginSql = sql;
      if (!this.#session) {
        this.#stickyPins = PIN.set;
        this.#pin(PIN.set);
      }
      this.#setupAnswers++;
      server.write(query(sql));
      server.settledFor = null;
    }
    // The connection's session parameters made the client's, ahead of anything the client sends.
    if (server.settledFor !== this.#wanted) {
      const setup = setupQuery(this.#wanted, server.params);
      if (setup) {
        this.#setupAnswers++;
        server.write(setup);
      } else server.settledFor = this.#wanted;
    }
    return true;
  }

  /** An answer to our SET: swallowed; the server's spelling of each value is kept; an error ends the client. */
  #onSetupFrame(type: number, frame: Buffer): void {
    if (type === PARAMETER_STATUS) {
      const p = readParameterStatus(frame);
      if (p) this.#keepWanted(p.name, p.value);
    } else if (type === ERROR) {
      this.#setupError ??= frame;
    } else if (type === READY && --this.#setupAnswers === 0 && !this.#setupError) {
      // Everything the client sent on this link was answered here (a refused statement): the link ends now.
      if (this.#server && !this.#session && this.#pins === 0 && this.#syncs === 0 && !this.#midBatch && this.#server.status === 'I' && !this.#skipping) {
        this.#unlink();
      }
    } else if (type === READY && this.#setupAnswers === 0 && this.#setupError) {
      const f = errorFields(this.#setupError);
      this.#setupError = null;
      if (this.#server) {
        forgetUnreported(this.#server.params);
        this.#server.settledFor = null;
      }
      this.#fatal(f.get('C') ?? SQLSTATE.protocolViolation, `a session parameter given at login cannot be applied: ${f.get('M') ?? 'error'}`);
    }
  }

  /** A tracked parameter's value as the server spells it, or as the client's own SET left it. */
  #keepWanted(name: string, value: string): void {
    if (!this.#wanted.has(name) || this.#wanted.get(name) === value) return;
    this.#wanted = this.#servers!.shared(new Map(this.#wanted).set(name, value));
  }

  /** The pool as the current snapshot has it, after checking this client may still use it; null (and closed) if not. */
  #currentPool(): PoolEntry | null {
    const snap = this.#ctx.snapshot();
    if (this.#lastCheck.holds(snap, this.#ctx.clock)) return this.#pool;
    const pool = snap.pools.get(this.#poolName);
    if (!pool || pool.id !== this.#pool!.id) {
      this.#fatal(SQLSTATE.unknownPool, `pool ${this.#pool!.subdomain} no longer exists`);
      return null;
    }
    const refusal = this.#admissible(pool, snap);
    if (refusal) {
      this.#fatalRaw(refusal);
      return null;
    }
    this.#pool = pool;
    return pool;
  }

  /**
   * Answers the first pending batch with `err` without running it: a simple Query gets the error and
   * ReadyForQuery; an extended batch gets the error once and everything up to its Sync is dropped.
   */
  #failBatch(err: Buffer): void {
    this.#logError('request refused', err);
    const first = this.#queue[0];
    if (!first) return;
    if (first.type === Q) {
      this.#queue.shift();
      this.#send(Buffer.concat([err, readyForQuery('I')]));
      return;
    }
    this.#send(err);
    while (this.#queue.length > 0) {
      const { type } = this.#queue.shift()!;
      if (type === S) {
        this.#send(readyForQuery('I'));
        return;
      }
      if (type === X) return this.#end();
    }
    this.#skipping = true;
  }

  /**
   * Passes one client frame, bytes [start, end) of `buf`, on to the linked server, renaming named prepared
   * statements. Frames passed unchanged go as ranges of the chunk (no Buffer made for them).
   */
  #forward(type: number, buf: Buffer, start: number, end: number): void {
    switch (type) {
      case S:
        this.#midBatch = false;
        // In copy-in the server ignores Sync (and answers nothing to it).
        if (!this.#copyIn) {
          this.#expect.push(SYNC);
          this.#syncs++;
        }
        return this.#toServer.addRange(buf, start, end);
      case Q: {
        const e = queryEffect(buf, start + 5, end - 1);
        if (e !== NONE && this.#sessionState(e, true)) return;
        this.#expect.push(QUERY_END);
        this.#syncs++;
        this.#midBatch = false;
        return this.#toServer.addRange(buf, start, end);
      }
      case F:
        this.#expect.push(QUERY_END);
        this.#syncs++;
        this.#midBatch = false;
        return this.#toServer.addRange(buf, start, end);
      case CC:
      case CF:
        this.#copyIn = false;
        return this.#toServer.addRange(buf, start, end);
      case P:
      case B:
      case D:
      case C:
        return this.#forwardStatement(type, buf, start, end);
      default:
        if (type !== H && type !== CD) this.#midBatch = true;
        return this.#toServer.addRange(buf, start, end);
    }
  }

  /** Parse, Bind, Describe, Close: through the statement renaming (statements.ts), which needs the frame itself. */
  #forwardStatement(type: number, buf: Buffer, start: number, end: number): void {
    const frame = start === 0 && end === buf.length ? buf : buf.subarray(start, end);
    this.#cur = frame;
    this.#curBuf = buf;
    this.#curStart = start;
    this.#curEnd = end;
    try {
      if (type === P) {
        // The unnamed statement pins when parsed (its Bind follows in the same batch); a named one at each Bind.
        const named = frame[5] !== 0;
        const textAt = named ? frame.indexOf(0, 5) + 1 : 6;
        const e = textAt > 0 ? statementEffect(frame, textAt, frame.length) : NONE;
        if (e !== NONE && e.pins !== 0 && (!named || this.#refusing) && this.#sessionState(e, false)) return;
        this.#midBatch = true;
        this.#statements.forward(type, frame, this.#server!, this.#expect, this.#out, e.pins);
      } else if (type === B) {
        this.#midBatch = true;
        const pins = this.#statements.forward(type, frame, this.#server!, this.#expect, this.#out);
        if (pins !== 0 && !this.#session) this.#pin(pins);
      } else {
        this.#midBatch = true;
        this.#statements.forward(type, frame, this.#server!, this.#expect, this.#out);
      }
    } finally {
      this.#cur = null;
      this.#curBuf = null;
    }
  }

  /** The pool refuses session state in transaction mode (wireSessionState: 'refuse'). */
  get #refusing(): boolean {
    return !this.#session && this.#pool!.settings.wireSessionState === 'refuse';
  }

  /**
   * A statement that creates or removes session state is about to be forwarded. Transaction mode pins the
   * client (or, under wireSessionState 'refuse', answers it with 0A000 here and returns true: nothing ran).
   * A simple Query that removes state is noted, to unpin once it has succeeded outside any transaction.
   */
  #sessionState(e: Effect, query: boolean): boolean {
    if (e.pins !== 0 && !this.#session) {
      if (this.#refusing) return this.#refuseState(e.pins, query);
      this.#pin(e.pins);
    }
    if (query && (e.clears !== 0 || e.dropsPrepared || e.resetsSettings)) {
      // Only a Query alone on the wire, outside a transaction block: its one ReadyForQuery says whether it ran.
      this.#pendingClear = this.#syncs === 0 && !this.#midBatch && this.#server!.status === 'I' ? e : null;
    }
    return false;
  }

  #pin(bits: number): void {
    const added = bits & ~this.#pins;
    if (added === 0) return;
    this.#pins |= added;
    const m = this.#ctx.pins;
    if (m) for (const reason of PIN_REASONS) if (added & PIN[reason]) m.pinned(this.#pool!.subdomain, reason);
  }

  #unpin(bits: number, all = false): void {
    const removed = bits & this.#pins & (all ? ALL_PINS : ~this.#stickyPins);
    if (removed === 0) return;
    this.#pins &= ~removed;
    const m = this.#ctx.pins;
    if (m) for (const reason of PIN_REASONS) if (removed & PIN[reason]) m.unpinned(this.#pool!.subdomain, reason);
  }

  /** wireSessionState 'refuse': the statement is answered 0A000 here and never reaches the server. */
  #refuseState(bits: number, query: boolean): true {
    const kinds = PIN_REASONS.filter((r) => bits & PIN[r]).join(', ');
    const message =
      `pool ${this.#pool!.subdomain} refuses statements that create session state (${kinds}) in transaction mode ` +
      `(pool setting wireSessionState: 'refuse'); set wireSessionState to 'pin', or wirePoolMode to 'session'`;
    // Answers still owed ahead of it (a pipelining client): an answer of ours cannot be put in order.
    if (this.#syncs !== 0 || this.#midBatch) {
      this.#fatal(SQLSTATE.featureNotSupported, message);
      return true;
    }
    this.#send(error(SQLSTATE.featureNotSupported, message));
    if (query) this.#localReady();
    else this.#skipping = true;
    return true;
  }

  /**
   * A ReadyForQuery of ours for a batch that never reached the server: the server connection's transaction
   * status, and, in transaction mode, the link ends if that leaves nothing open.
   */
  #localReady(): void {
    const server = this.#server;
    this.#send(readyForQuery(server?.status ?? 'I'));
    // (While our SET's answers are still to come, its ReadyForQuery ends the link instead: #onSetupFrame.)
    if (server && !this.#session && this.#pins === 0 && server.status === 'I' && this.#syncs === 0 && !this.#midBatch && this.#setupAnswers === 0) this.#unlink();
  }

  /** A noted removal of session state succeeded: the client is unpinned from it, the connection's bookkeeping follows. */
  #applyClear(e: Effect): void {
    this.#pendingClear = null;
    const server = this.#server;
    if (e.clears !== 0) this.#unpin(e.clears);
    if (server && e.dropsPrepared) server.prepared.clear();
    if (server && e.resetsSettings) {
      server.resetUnreported();
      if (this.#loginSql !== null) {
        this.#setupAnswers++;
        server.write(query(this.#loginSql));
      }
    }
  }

  onServerDrain(): void {
    this.#unpause(PAUSE_SERVER_FULL);
  }

  #unpause(bit: number): void {
    if ((this.#pause & bit) === 0) return;
    this.#pause &= ~bit;
    if (this.#pause === 0 && !this.#gone) this.#socket.resume();
  }

  onServerFrame(type: number, buf: Buffer, start: number, end: number): void {
    if (this.#setupAnswers > 0) return this.#onSetupFrame(type, buf.subarray(start, end));
    if (type === PARSE_COMPLETE || type === CLOSE_COMPLETE) {
      const e = this.#expect[0];
      if (typeof e === 'object') {
        this.#expect.shift();
        if (e.drop) return;
      }
    } else if (type === READY) {
      if (this.#pendingClear !== null) this.#applyClear(this.#pendingClear);
      // Entries before this Sync never answered (an error skipped them): their statements were not prepared,
      // and those we closed are still there.
      let kept: Set<string> | null = null;
      while (this.#expect.length > 0) {
        const e = this.#expect.shift()!;
        if (typeof e !== 'object') break;
        if (e.closes) {
          this.#server?.prepared.add(e.closes);
          (kept ??= new Set()).add(e.closes);
        } else if (e.name && !kept?.has(e.name)) this.#server?.prepared.delete(e.name);
      }
      this.#copyIn = false;
      if (this.#syncs > 0) this.#syncs--;
    } else if (type === COPY_IN) {
      this.#copyIn = true;
      // An extended-protocol COPY: the Sync sent right after its Execute reaches the server in copy-in, which ignores it.
      const i = this.#expect.findIndex((e) => typeof e !== 'object');
      if (i >= 0 && this.#expect[i] === SYNC) {
        this.#expect.splice(i, 1);
        this.#syncs--;
      }
    } else if (type === COMMAND_COMPLETE) {
      this.#copyIn = false;
    } else if (type === PARAMETER_STATUS) {
      // The client's own SET of a tracked parameter: it keeps that value in its later transactions too.
      const p = readParameterStatus(buf.subarray(start, end));
      if (p) this.#keepWanted(p.name, p.value);
    } else if (type === ERROR) {
      this.#copyIn = false;
      this.#pendingClear = null;
      // The server is going away (terminated 57P01, shutting down 57P02/57P03): the client gets the server's own
      // error, which drivers key failover on, and the close that follows ends the client.
      if (isFatal(buf, start, end)) this.#serverFatal = true;
    }
    this.#toClient.addRange(buf, start, end);
    if (type !== READY || this.#terminating) return;
    this.onServerChunkEnd();
    // Not while an extended batch is open (Parse/Bind/… forwarded after the last Query or Sync, its Sync still
    // to come): that server connection has work of this client's in it, and after an error in it PostgreSQL
    // skips everything until a Sync — handed to another client, it would swallow that client's messages.
    if (this.#syncs !== 0 || this.#midBatch || buf[start + 5] !== 0x49 /* I */) return;
    // Out of any transaction: no portal is left that needs one of the statements used in it.
    this.#statements.transactionEnd();
    this.#transactions++;
    if (!this.#session && this.#pins === 0) this.#unlink();
  }

  /** The transaction is over: the server connection goes back idle and the slot is freed. */
  #unlink(): void {
    const server = this.#server!;
    const permit = this.#permit!;
    this.#server = null;
    this.#permit = null;
    server.link = null;
    server.resume();
    this.#unpause(PAUSE_SERVER_FULL);
    const now = performance.now();
    this.#servers!.release(server, 'none', 0, now);
    const latencyMs = now - this.#linkedAt;
    permit.release({ latencyMs });
    this.#record(this.#pool!, 'proxied', 200, latencyMs);
    if (this.#queue.length > 0) this.#linkAndDrain();
  }

  onServerClosed(): void {
    this.#toServer.clear();
    this.#setupAnswers = 0;
    this.#setupError = null;
    const permit = this.#permit;
    this.#server = null;
    this.#permit = null;
    permit?.release({ dropped: true });
    if (this.#gone) return;
    if (this.#terminating) return this.#end();
    this.#record(this.#pool!, 'upstream_aborted', 502, null);
    this.#unpause(PAUSE_SERVER_FULL);
    if (this.#serverFatal) return this.#end();
    if (this.#session) return this.#fatal(SQLSTATE.upstreamLost, 'the server connection was lost; the session ended');
    // Its session state (what pinned it) is gone with the connection: the client cannot go on as if it were not.
    if (this.#pins !== 0) return this.#fatal(SQLSTATE.upstreamLost, 'the server connection was lost, and with it this session\'s state (SET, temporary tables, LISTEN, locks); the session ended');
    const waiting = this.#syncs > 0 || this.#midBatch;
    this.#expect.length = 0;
    this.#syncs = 0;
    this.#midBatch = false;
    // A client waiting for answers cannot be told which of its statements ran: it is closed, as PostgreSQL would.
    if (waiting) return this.#fatal(SQLSTATE.upstreamLost, 'the server connection was lost while running this request; its transaction was rolled back');
    // The client sits inside a transaction and is not waiting: its next batch learns of the loss.
    this.#lostTransaction = true;
  }

  #record(pool: PoolEntry, outcome: RequestRecord['outcome'], status: number, upstreamMs: number | null): void {
    this.#ctx.metrics?.record({
      poolId: pool.id,
      pool: pool.subdomain,
      status,
      outcome,
      admission: this.#admission,
      waited: this.#waited,
      queuedMs: this.#queuedMs,
      upstreamMs,
    });
  }

  /** Cancels the query running for this client (a CancelRequest naming its BackendKeyData). */
  cancelRunning(): void {
    this.#server?.cancel();
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
    this.#ctx.wireLog.refused(what, { pool: this.#pool?.subdomain ?? null, peer: this.address, user: this.#user, code, message: field('M') });
  }

  #fatalRaw(frame: Buffer): void {
    if (this.#gone) return;
    this.#endReason ??= `error ${/\0C([^\0]*)/.exec(frame.toString('latin1', 5))?.[1] ?? ''}`.trim();
    this.#logError(this.#loginTimer !== null ? 'login refused' : 'session ended', frame);
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
   * them), PostgreSQL would finish that batch before reading the Terminate: it goes to the server, whose
   * answers and close the client then gets, and that server connection is not reused.
   */
  #terminate(frame: Buffer): void {
    if (!this.#server || (this.#syncs === 0 && !this.#midBatch && !this.#copyIn)) return this.#end();
    this.#terminating = true;
    this.#pause |= PAUSE_ACQUIRE;
    this.#socket.pause();
    this.#toServer.add(frame);
    if (!this.#inChunk) this.#flushToServer();
  }

  /** The client is gone: its server connection is cleaned (or closed) and its slot freed. Runs once. */
  #closed(): void {
    if (this.#gone) return;
    this.#phase = 'closed';
    if (this.#loginTimer) clearTimeout(this.#loginTimer);
    this.#ctx.unregister(this);
    this.#abort?.abort();
    this.#queue.length = 0;
    const server = this.#server;
    const permit = this.#permit;
    this.#server = null;
    this.#permit = null;
    if (server) {
      server.link = null;
      server.resume();
      // Work still owed (a batch without its answer, or a COPY FROM STDIN the server waits on): never reusable.
      if (this.#syncs > 0 || this.#midBatch || this.#copyIn) this.#servers!.destroy(server);
      else this.#servers!.release(server, this.#session || this.#pins !== 0 ? 'discard' : 'rollback', this.#setupAnswers);
    }
    this.#unpin(ALL_PINS, true);
    if (permit) {
      permit.release({ dropped: true });
      this.#record(this.#pool!, 'client_aborted', 499, null);
    }
    if (!this.#socket.destroyed) this.#socket.destroySoon();
    if (this.#sessionStart !== null) {
      this.#ctx.wireLog.ended({
        pool: this.#pool?.subdomain ?? null, peer: this.address, user: this.#user, durationMs: Math.round(performance.now() - this.#sessionStart),
        bytesIn: this.#socket.bytesRead, bytesOut: this.#socket.bytesWritten, transactions: this.#transactions, reason: this.#endReason ?? 'client_disconnected',
      });
    }
  }

  /** Closes the connection now (listener shutdown). */
  terminate(message: string): void {
    this.#fatal(SQLSTATE.cannotConnectNow, message);
  }
}

function isFatal(buf: Buffer, start: number, end: number): boolean {
  // Severity fields come first: 'S' then 'V' (non-localized); FATAL and PANIC end the connection.
  const text = buf.toString('latin1', start + 5, Math.min(end, start + 40));
  return /\0?[SV](FATAL|PANIC)\0/.test(`\0${text}`);
}
