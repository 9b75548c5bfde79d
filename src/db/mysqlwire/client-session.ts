// One MySQL client connection: the handshake (pool named by the user, the pool key as the password,
// checked with caching_sha2_password), then its commands one at a time. Each statement outside a
// transaction takes a governor slot and a server connection and gives both back when it ends; a
// transaction keeps both until the server reports it closed.
import type { WireLog } from '../wire-log.js';
import { TLSSocket, type SecureContext } from 'node:tls';
import type { Duplex } from 'node:stream';
import type { Socket } from 'node:net';
import { abortableOf, type Admission, type Governor, type Permit } from '../../governor/governor.js';
import type { Logger } from '../../log.js';
import type { KeyEntry, PoolEntry, SnapshotFeed } from '../../pool-request/snapshot.js';
import { liveKey } from '../../pool-request/authenticate.js';
import { refusalReply } from '../../pool-request/refusal.js';
import type { DataplaneMetrics } from '../../pool-request/release.js';
import type { Policies } from '../../policies/index.js';
import type { OutcomeName } from '../../pool-request/exchange.js';
import { FrameReader, type Packet } from './frame-reader.js';
import { BASE_CAPABILITIES, CLIENT, COM, MARIADB, STATUS, VARIANT_CAPABILITIES, VARIANT_MARIADB_METADATA, authSwitchPacket, eofPacket, errPacket, frame, handshakePacket, okPacket, readNulString } from './packets.js';
import { parseHandshakeResponse, type HandshakeResponse } from './client-handshake.js';
import { makeNonce, scrambleMatches } from './scramble.js';
import { refusalError, wireError, type WireError } from './wire-errors.js';
import { poolSignature, type ServerPool } from './server-pool.js';
import type { Greeting, ServerIdentity } from './server-identity.js';
import { ServerLost, type Answer, type ServerConn, type ServerStatement } from './server-conn.js';
import { ClientStatement, LONG_DATA_LIMIT, longDataFor, prepareOk, remember } from './statements.js';
import type { ResponseKind } from './response-scanner.js';
import { CLEAR, DIRTY, PIN, PIN_MASK, PIN_REASONS, sessionEffects } from './session-state.js';
import { directReads } from '../direct-reads.js';
import { replaying } from '../replay-stream.js';
import { killRequest, processKill, type KillRequest } from './kill.js';
import { LastCheck } from '../wire-recheck.js';

/**
 * Largest client packet: 64 MiB (MySQL 8's default max_allowed_packet). One of 16 MiB or more comes split
 * and goes to the server split the same way; the server's own max_allowed_packet applies after this.
 */
export const MAX_CLIENT_PACKET = 64 << 20;
/** Largest login packet (a handshake response with connection attributes is well under this). */
const MAX_LOGIN_PACKET = 64 * 1024;
/** Handshake packets are small; a client must finish logging in within this. */
const LOGIN_TIMEOUT_MS = 10_000;
const NO_HEADERS: Array<[string, string]> = [];

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

/** MariaDB's COM_STMT_EXECUTE id for "the statement prepared just before" (pipelined prepare + execute). */
const LAST_PREPARED = 0xffffffff;

/** `change`: a COM_CHANGE_USER was answered with an auth switch; the client's scramble comes next. */
type Phase = 'handshake' | 'switch' | 'command' | 'change' | 'closed';

export class ClientSession {
  /** The connection id this client's greeting gave it (what it may name in KILL). */
  readonly id: number;
  readonly #deps: SessionDeps;
  readonly #onClose: (s: ClientSession) => void;
  #socket: Socket;
  /** A session whose login was logged, for its end line (src/db/wire-log.ts). */
  #session: { start: number; user: string; peer: string; transactions: number; reason: string | undefined } | null = null;
  readonly #frames = new FrameReader(MAX_LOGIN_PACKET);
  #nonce = makeNonce();
  #phase: Phase = 'handshake';
  #busy = false;
  #hello: HandshakeResponse | null = null;
  #loginTimer: NodeJS.Timeout | null;
  #pool: PoolEntry | null = null;
  #keyHash: string | null = null;
  #variant = 0;
  #collation = 45;
  /** Capabilities (classic, MariaDB's) the greeting offered: the client may take some. */
  #offered = 0;
  #offeredMariadb = 0;
  /** The client took MariaDB's bulk operations (COM_STMT_BULK_EXECUTE). */
  #bulk = false;
  /** The transaction this client is in: its server connection and slot, kept between statements. */
  #conn: ServerConn | null = null;
  #permit: Permit | null = null;
  /** The governor's grant behind #permit, recorded with the statement or transaction it admitted. */
  #admission: Admission | null = null;
  #heldSince = 0;
  #queuedMs = 0;
  #waited = false;
  /** The server connection a command is running on right now. */
  #running: ServerConn | null = null;
  /** Ends a transaction left idle longer than the pool's request timeout. */
  #idleTimer: NodeJS.Timeout | null = null;
  readonly #statements = new Map<number, ClientStatement>();
  #nextStatement = 1;
  /** The id of the last COM_STMT_PREPARE that succeeded; 0 after one that failed (MariaDB's direct execute names it by LAST_PREPARED). */
  #lastPrepared = 0;
  /** wirePoolMode 'session': the first statement's server connection and slot stay with the client until it leaves. */
  #sessionMode = false;
  readonly #abort = new AbortController();
  /** #abort as the governor takes it (made once per session, not per statement). */
  readonly #abortable = abortableOf(this.#abort.signal);
  /** Session state this client made on #conn (session-state.ts PIN bits): it keeps #conn and the slot while any is set. */
  #pins = 0;
  /** The slot held now was held pinned at some point: its hold time is no latency sample. */
  #heldPinned = false;
  /** When #livePool's check last passed. */
  #lastCheck = new LastCheck();
  /**
   * The server connection that asked this client for a LOCAL INFILE file (as the answer to the client's own
   * COM_QUERY): the client's packets go to it until the empty one that ends the file.
   */
  #fileTo: { conn: ServerConn; sent: boolean; done: () => void } | null = null;

  /** Where the TCP connection's bytes go: the packet reader, until a TLS upgrade takes them. */
  #fromTcp: (chunk: Buffer) => void = (c) => this.#onData(c);

  /** `accepted` must not be read yet (the listener accepts with pauseOnConnect): its reads are taken over here. */
  constructor(accepted: Socket, id: number, deps: SessionDeps, onClose: (s: ClientSession) => void) {
    this.id = id;
    this.#deps = deps;
    this.#onClose = onClose;
    const socket = directReads(accepted, (c) => this.#fromTcp(c));
    this.#socket = socket;
    socket.setNoDelay(true);
    this.#attach(socket);
    this.#loginTimer = setTimeout(() => this.close(), LOGIN_TIMEOUT_MS);
    // Learned from the pools' servers (server-identity.ts); only while nothing is learned yet and a probe
    // runs does the greeting wait for it, at most GREETING_WAIT_MS (the client cannot speak first).
    const greeting = deps.identity.greeting();
    if (greeting instanceof Promise) void greeting.then((g) => this.#greet(id, g));
    else this.#greet(id, greeting);
  }

  #greet(id: number, g: Greeting): void {
    if (this.#phase !== 'handshake') return;
    this.#offeredMariadb = g.mariadbCapabilities;
    const caps = BASE_CAPABILITIES | CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS | CLIENT.LOCAL_FILES | g.capabilities | CLIENT.CONNECT_ATTRS | (this.#deps.tls ? CLIENT.SSL : 0);
    this.#offered = caps;
    this.#send(handshakePacket(g.version, id, this.#nonce, caps, STATUS.AUTOCOMMIT, g.mariadbCapabilities));
  }

  /** In a transaction or pinned by session state (holding a slot and a server connection between statements). */
  get pinned(): boolean {
    return this.#conn !== null;
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
    while ((!this.#busy || this.#fileTo) && this.#phase !== 'closed') {
      const p = this.#frames.next();
      if (!p) {
        if (this.#frames.oversized) {
          if (this.#phase === 'command') this.#fail(0, 'packetTooLarge', `packet larger than ${MAX_CLIENT_PACKET} bytes`);
          else this.#fail(0, 'badHandshake', 'bad handshake');
        }
        return;
      }
      let r: void | Promise<void>;
      try {
        r = this.#packet(p);
      } catch (err) {
        // A bug must cost this one connection, never the process.
        this.#deps.log.error({ err }, 'mysql listener: packet handling failed');
        this.close();
        return;
      }
      if (r instanceof Promise) {
        this.#busy = true;
        r.catch((err: unknown) => {
          this.#deps.log.error({ err }, 'mysql listener: command failed unexpectedly');
          this.close();
        }).finally(() => {
          this.#busy = false;
          this.#pump();
        });
      }
    }
  }

  #logRefusal(what: string, code: string, message: string): void {
    this.#deps.wireLog?.refused(what, { pool: this.#pool?.subdomain ?? null, peer: this.#socket.remoteAddress ?? '', code, message });
  }

  #send(b: Buffer): void {
    if (this.#phase !== 'closed') this.#socket.write(b);
  }

  /** An ERR, then the connection is closed (login failures, protocol errors). */
  #fail(seq: number, e: WireError, message: string): void {
    if (this.#phase === 'closed') return;
    if (this.#session) this.#session.reason ??= `error ${e}`;
    this.#logRefusal(this.#phase === 'command' ? 'session ended' : 'login refused', e, message);
    this.#socket.end(wireError(seq, e, message));
    this.close();
  }

  #packet(p: Packet): void | Promise<void> {
    if (this.#fileTo) return this.#filePacket(p);
    if (this.#phase === 'handshake') return this.#handshake(p);
    if (this.#phase === 'switch') return this.#authenticate(p.seq, p.payload);
    if (this.#phase === 'change') return this.#changed(p.seq, p.payload);
    // Every command starts a new exchange at sequence 0. Anything else is a desynchronised client (MariaDB
    // answers 1156 too): running it could execute bytes the client meant as something else, e.g. a
    // START TRANSACTION that commits the open transaction. The session is closed and its transaction rolled back.
    if (p.seq !== 0) return this.#fail((p.seq + 1) & 0xff, 'packetsOutOfOrder', 'Got packets out of order');
    return this.#command(p.payload);
  }

  // ------------------------------------------------------------------------------------ login

  #handshake(p: Packet): void {
    const h = parseHandshakeResponse(p.payload);
    if (!h) return this.#fail(p.seq + 1, 'badHandshake', 'bad handshake');
    if (h.sslRequest) {
      if (!this.#deps.tls || this.#socket instanceof TLSSocket) return this.#fail(p.seq + 1, 'badHandshake', 'TLS is not offered');
      this.#upgrade();
      return;
    }
    this.#hello = h;
    this.#variant = h.capabilities & VARIANT_CAPABILITIES & this.#offered;
    // Extended column metadata taken: its server connections are opened with it (upstream-login.ts).
    if ((h.mariadbCapabilities & this.#offeredMariadb & MARIADB.EXTENDED_METADATA) !== 0) this.#variant |= VARIANT_MARIADB_METADATA;
    this.#bulk = (h.mariadbCapabilities & this.#offeredMariadb & MARIADB.STMT_BULK_OPERATIONS) !== 0;
    this.#collation = h.collation;
    // Any other plugin is asked to switch to caching_sha2_password, the one a key known by its hash can verify,
    // as MySQL does. That includes an empty answer under another plugin's name: libmariadb sends
    // `dummy_fallback_auth` when its caching_sha2_password plugin is not loaded yet (seen with sysbench's
    // threads connecting at once); by the switch it is. Only a client without plugin support is taken as is.
    const pluginAuth = (h.capabilities & CLIENT.PLUGIN_AUTH) !== 0;
    if (h.plugin === 'caching_sha2_password' || (!pluginAuth && h.auth.length === 0)) return this.#authenticate(p.seq, h.auth);
    this.#phase = 'switch';
    this.#send(authSwitchPacket(p.seq + 1, 'caching_sha2_password', this.#nonce));
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
    this.#attach(secure);
  }

  #authenticate(seq: number, scramble: Buffer): void {
    const h = this.#hello!;
    const snap = this.#deps.snapshots.current;
    const name = h.user.toLowerCase();
    const pool = snap.pools.get(name);
    const denied = (why: string) => this.#fail(seq + 1, 'accessDenied', `Access denied for user '${h.user}' (${why})`);
    if (!pool || pool.backend !== 'mysql') return denied('unknown pool or invalid key');
    if (pool.status !== 'active') return denied('the pool is suspended');
    if (!pool.database || poolSignature(pool) === null) return denied('the pool has no database or no role attached');
    let keyHash: string | null = null;
    let key: KeyEntry | null = null;
    if (scramble.length > 0) {
      const found = this.#keyFor(pool, scramble);
      if (!found) return denied('unknown pool or invalid key');
      [keyHash, key] = found;
    } else if (pool.requireKey) return denied('the pool key is the password');
    if (h.database && h.database !== pool.database.name) {
      return this.#fail(seq + 1, 'dbAccessDenied', `Access denied for user '${h.user}' to database '${h.database}' (the pool's database is '${pool.database.name}')`);
    }
    const refused = this.#policyRefusal(pool, key);
    if (refused) return this.#fail(seq + 1, refused[0], refused[1]);
    this.#pool = pool;
    this.#keyHash = keyHash;
    this.#sessionMode = pool.settings.wirePoolMode === 'session';
    this.#phase = 'command';
    this.#frames.limit = MAX_CLIENT_PACKET;
    if (this.#loginTimer) clearTimeout(this.#loginTimer);
    this.#loginTimer = null;
    if (this.#deps.wireLog?.loggedIn({ pool: pool.subdomain, peer: this.#socket.remoteAddress ?? '', user: h.user })) {
      this.#session = { start: performance.now(), user: h.user, peer: this.#socket.remoteAddress ?? '', transactions: 0, reason: undefined };
    }
    // fast_auth_success, then OK.
    this.#send(frame(seq + 1, Buffer.from([0x01, 0x03])));
    this.#send(okPacket(seq + 2, STATUS.AUTOCOMMIT));
  }

  /** The live key of `pool` whose caching_sha2_password scramble (over #nonce) is `scramble`. */
  #keyFor(pool: PoolEntry, scramble: Buffer): [string, KeyEntry] | null {
    const now = this.#deps.clock();
    for (const [hash, entry] of this.#deps.snapshots.current.keys) {
      if (entry.poolId !== pool.id || (entry.expiresAt !== null && entry.expiresAt <= now)) continue;
      if (scrambleMatches(scramble, this.#nonce, hash, entry)) return [hash, entry];
    }
    return null;
  }

  /**
   * COM_CHANGE_USER, which pools send to reset a connection: to the same pool (the user names it), the key
   * is checked again (auth switch to caching_sha2_password with a new nonce) and the session is reset as
   * COM_RESET_CONNECTION does; to another user it is refused and the session stays as it was (a session's
   * pool is chosen at login: another pool is another connection).
   */
  #changeUser(p: Buffer): void {
    const u = readNulString(p, 1);
    if (!u) return this.#send(wireError(1, 'unknownCommand', 'malformed COM_CHANGE_USER'));
    const pool = this.#pool!;
    if (u[0].toLowerCase() !== pool.subdomain.toLowerCase()) {
      this.#logRefusal('change user refused', 'notSupported', `to user '${u[0]}'`);
      return this.#send(wireError(1, 'notSupported', `COM_CHANGE_USER to another user ('${u[0]}') is not supported by poolgate: the user names the pool (${pool.subdomain}), and another pool needs another connection; this session is unchanged`));
    }
    let o = u[1];
    const authLen = p[o];
    if (authLen === undefined) return this.#send(wireError(1, 'unknownCommand', 'malformed COM_CHANGE_USER'));
    o += 1 + authLen;
    const db = o < p.length ? readNulString(p, o) : null;
    if (db && db[0] !== '' && db[0] !== pool.database!.name) {
      return this.#send(wireError(1, 'dbAccessDenied', `Access denied for user '${u[0]}' to database '${db[0]}' (the pool's database is '${pool.database!.name}'); this session is unchanged`));
    }
    if (db && db[1] + 2 <= p.length) this.#collation = p[db[1]]!;
    this.#nonce = makeNonce();
    this.#phase = 'change';
    this.#send(authSwitchPacket(1, 'caching_sha2_password', this.#nonce));
  }

  /** The client's scramble after COM_CHANGE_USER: the session is reset (a wrong key ends it, as a failed login). */
  #changed(seq: number, scramble: Buffer): void {
    const pool = this.#pool!;
    let keyHash: string | null = null;
    if (scramble.length > 0) {
      const found = this.#keyFor(pool, scramble);
      if (!found) return this.#fail(seq + 1, 'accessDenied', `Access denied for user '${pool.subdomain}' (unknown pool or invalid key)`);
      keyHash = found[0];
    } else if (pool.requireKey) return this.#fail(seq + 1, 'accessDenied', `Access denied for user '${pool.subdomain}' (the pool key is the password)`);
    this.#keyHash = keyHash;
    this.#lastCheck = new LastCheck();
    this.#phase = 'command';
    this.#dropSession();
    this.#send(frame(seq + 1, Buffer.from([0x01, 0x03])));
    this.#send(okPacket(seq + 2, STATUS.AUTOCOMMIT));
  }

  /** The IP allowlist applies at login; HTTP-shaped policies (HMAC, JWT, access proxy) refuse wire clients. */
  #policyRefusal(pool: PoolEntry, key: KeyEntry | null): [WireError, string] | null {
    const peer = this.#socket.remoteAddress ?? '';
    const r = this.#deps.policies?.wireRefusal(pool, key, peer, 'MYSQL') ?? null;
    if (r === null) return null;
    if (r.reason === 'needs_http') return ['accessDenied', `the pool requires ${r.policy}, which MySQL clients cannot carry`];
    return ['hostNotAllowed', `Host '${peer}' is not allowed to use this pool`];
  }

  // --------------------------------------------------------------------------------- commands

  #command(p: Buffer): void | Promise<void> {
    if (this.#idleTimer) {
      clearTimeout(this.#idleTimer);
      this.#idleTimer = null;
    }
    if (p.length === 0) return this.#fail(0, 'unknownCommand', 'empty command packet');
    switch (p[0]) {
      case COM.QUIT:
        if (this.#session) this.#session.reason ??= 'client_terminated';
        this.close();
        return;
      case COM.PING:
        this.#send(okPacket(1, this.#status()));
        return;
      case COM.INIT_DB: {
        const db = p.toString('utf8', 1);
        // Back to the pool's database after a USE elsewhere: the server connection has to hear it.
        if (db === this.#pool!.database!.name && (this.#pins & PIN.use_database) !== 0) return this.#forward(p, 'single', CLEAR.use_database);
        if (db === this.#pool!.database!.name) this.#send(okPacket(1, this.#status()));
        else this.#send(wireError(1, 'dbAccessDenied', `Access denied to database '${db}' (the pool's database is '${this.#pool!.database!.name}')`));
        return;
      }
      case COM.QUERY: {
        const kill = killRequest(p);
        if (kill) return this.#kill(kill);
        const effects = sessionEffects(p, this.#pool!.database!.name, this.#conn !== null && !this.#conn.clean);
        if ((effects & PIN_MASK) !== 0 && this.#pool!.settings.wireSessionState === 'refuse') return this.#refuseState();
        return this.#forward(p, 'result', effects, (this.#variant & CLIENT.LOCAL_FILES) !== 0);
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
        if (!this.#bulk) return this.#send(wireError(1, 'unknownCommand', 'COM_STMT_BULK_EXECUTE without the bulk operations capability'));
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
        if (!st) return this.#send(wireError(1, 'unknownStatement', 'Unknown prepared statement handler given to mysqld_stmt_reset'));
        st.longData = [];
        st.longBytes = 0;
        this.#send(okPacket(1, this.#status()));
        return;
      }
      case COM.SET_OPTION: {
        if (p.length < 3) return this.#send(wireError(1, 'unknownCommand', 'malformed COM_SET_OPTION'));
        if (this.#conn) return this.#send(wireError(1, 'notSupported', 'COM_SET_OPTION inside a transaction or with session state (pinned) is not supported by poolgate'));
        const on = p.readUInt16LE(1) === 0;
        this.#variant = on ? this.#variant | CLIENT.MULTI_STATEMENTS : this.#variant & ~CLIENT.MULTI_STATEMENTS;
        this.#send(eofPacket(1, this.#status()));
        return;
      }
      case COM.RESET_CONNECTION:
        return this.#resetSession();
      case COM.PROCESS_KILL: {
        const kill = processKill(p);
        if (!kill) return this.#send(wireError(1, 'unknownCommand', 'malformed COM_PROCESS_KILL'));
        return this.#kill(kill);
      }
      case COM.CHANGE_USER:
        return this.#changeUser(p);
      case COM.STMT_FETCH:
        return this.#send(wireError(1, 'notSupported', 'cursors (COM_STMT_FETCH) are not supported by poolgate'));
      default:
        // Binlog and replication commands, shutdown, process kill/info, debug, ...: refused without closing.
        return this.#send(wireError(1, p[0]! <= 0x1f ? 'notSupported' : 'unknownCommand', `command 0x${p[0]!.toString(16)} is not supported by poolgate`));
    }
  }

  /** A client statement by id; LAST_PREPARED names the one prepared just before (none when that prepare failed). */
  #statement(id: number): ClientStatement | undefined {
    return this.#statements.get(id === LAST_PREPARED ? this.#lastPrepared : id);
  }

  #status(): number {
    return this.#conn ? this.#conn.status : STATUS.AUTOCOMMIT;
  }

  /** `localFiles`: a COM_QUERY of a client that announced CLIENT_LOCAL_FILES (the server may ask it for a file). */
  #forward(p: Buffer, kind: ResponseKind, effects = 0, localFiles = false): Promise<void> {
    const cmd = frame(0, p);
    const run = (conn: ServerConn) => (localFiles ? this.#query(conn, cmd) : conn.run(cmd, kind, this.#socket));
    if (effects === 0) return this.#withServer(run);
    return this.#withServer((conn) => this.#tracked(conn, effects, run(conn)));
  }

  /**
   * A COM_QUERY that may load local files: each LOCAL INFILE request the server answers with was relayed to
   * the client; its file packets, up to the empty one, go back to the same server connection, and the
   * server's answer goes on (OK or ERR, maybe more results).
   */
  async #query(conn: ServerConn, cmd: Buffer): Promise<Answer> {
    let a = await conn.run(cmd, 'result', this.#socket, true);
    while (a.fileRequest) {
      const rest = conn.follow(this.#socket);
      const file = { conn, sent: false, done: () => {} };
      await new Promise<void>((done) => {
        file.done = done;
        this.#fileTo = file;
        this.#pump();
        // The answer ended before the client's file did (the server gave up, or the connection broke): the
        // connection, out of step, is not used again, and the rest of the file is swallowed (#filePacket).
        rest.then(() => { if (!file.sent) conn.destroy(); }, () => {}).finally(done);
      });
      a = await rest;
    }
    return a;
  }

  /** One packet of a LOCAL INFILE file, relayed as is; the empty one ends the file. */
  #filePacket(p: Packet): void {
    const to = this.#fileTo!;
    if (p.payload.length === 0) {
      this.#fileTo = null;
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
    if ((effects & (PIN_MASK | DIRTY)) !== 0) conn.dirty = true;
    const before = this.#pins;
    this.#pin(effects & PIN_MASK);
    const a = await run;
    if (a.error) {
      if ((this.#variant & CLIENT.MULTI_STATEMENTS) === 0) this.#unpin(this.#pins & ~before);
    } else {
      if (effects & CLEAR.lock_tables) this.#unpin(PIN.lock_tables);
      if (effects & CLEAR.get_lock) this.#unpin(PIN.get_lock);
      if (effects & CLEAR.use_database) this.#unpin(PIN.use_database);
    }
    return a;
  }

  #pin(bits: number): void {
    const added = bits & ~this.#pins;
    if (added === 0) return;
    this.#pins |= added;
    this.#heldPinned = true;
    this.#countPins(added, 1);
  }

  #unpin(bits: number): void {
    const gone = bits & this.#pins;
    if (gone === 0) return;
    this.#pins &= ~gone;
    this.#countPins(gone, -1);
  }

  #countPins(bits: number, delta: 1 | -1): void {
    const m = this.#deps.metrics;
    if (!m?.wirePinned || !this.#pool) return;
    for (const reason of PIN_REASONS) if ((bits & PIN[reason]) !== 0) m.wirePinned(this.#pool.subdomain, 'mysql', reason, delta);
  }

  /** wireSessionState 'refuse': the statement is not run, and nothing changes. */
  #refuseState(): void {
    this.#send(
      wireError(1, 'notSupported', `this statement creates session state (a user variable, SET, a temporary table, a lock, USE, PREPARE), which pool ${this.#pool!.subdomain} refuses (its wireSessionState setting is 'refuse'; 'pin' keeps such a client on its server connection)`),
    );
  }

  async #prepare(p: Buffer): Promise<void> {
    this.#lastPrepared = 0;
    if (killRequest(p)) return this.#send(wireError(1, 'notSupported', 'KILL cannot be prepared through poolgate: send it as a query (KILL [QUERY] <connection id>)'));
    const payload = Buffer.from(p);
    await this.#withServer(async (conn) => {
      const a = await conn.run(frame(0, payload), 'prepare', null);
      const ok = a.error ? null : prepareOk(a.bytes!);
      if (ok) {
        const st = new ClientStatement(payload, ok.params, sessionEffects(payload, this.#pool!.database!.name, false));
        remember(conn, st.key, { id: ok.id, params: ok.params });
        const id = this.#nextStatement++;
        if (this.#nextStatement >= LAST_PREPARED) this.#nextStatement = 1;
        this.#statements.set(id, st);
        this.#lastPrepared = id;
        // The answer as the server sent it, with poolgate's statement id.
        a.bytes!.writeUInt32LE(id, 5);
      }
      this.#send(a.bytes!);
      return a;
    });
  }

  async #execute(p: Buffer): Promise<void> {
    const st = p.length >= 10 ? this.#statement(p.readUInt32LE(1)) : undefined;
    if (!st) return this.#send(wireError(1, 'unknownStatement', 'Unknown prepared statement handler given to mysqld_stmt_execute'));
    if ((p[5]! & 0x07) !== 0) return this.#send(wireError(1, 'notSupported', 'cursors are not supported by poolgate: execute without a cursor type'));
    if (st.longBytes > LONG_DATA_LIMIT) {
      st.longData = [];
      st.longBytes = 0;
      return this.#send(wireError(1, 'packetTooLarge', `long data over ${LONG_DATA_LIMIT} bytes`));
    }
    if ((st.effects & PIN_MASK) !== 0 && this.#pool!.settings.wireSessionState === 'refuse') return this.#refuseState();
    const payload = Buffer.from(p);
    await this.#withServer(async (conn) => {
      const server = await this.#serverStatement(conn, st);
      if (!('id' in server)) return server;
      const exec = st.executeFor(payload, server.id, conn.mariadb);
      if (!exec) {
        // Parameters that do not fit the statement: answered as the server answers them (ER_MALFORMED_PACKET).
        this.#send(errPacket(1, 1835, 'HY000', 'Malformed communication packet'));
        return { error: true, status: conn.status, bytes: null };
      }
      for (const d of st.longData) conn.send(longDataFor(d, server.id));
      st.longData = [];
      st.longBytes = 0;
      const run = conn.run(frame(0, exec), 'result', this.#socket);
      return st.effects === 0 ? run : this.#tracked(conn, st.effects, run);
    });
  }

  /**
   * MariaDB's COM_STMT_BULK_EXECUTE (the connector's batch()): the client's statement id becomes the server
   * connection's, as for COM_STMT_EXECUTE; the rows of parameters travel as they are.
   */
  async #bulkExecute(p: Buffer): Promise<void> {
    const st = p.length >= 7 ? this.#statement(p.readUInt32LE(1)) : undefined;
    if (!st) return this.#send(wireError(1, 'unknownStatement', 'Unknown prepared statement handler given to mysqld_stmt_bulk_execute'));
    if ((st.effects & PIN_MASK) !== 0 && this.#pool!.settings.wireSessionState === 'refuse') return this.#refuseState();
    const payload = Buffer.from(p);
    await this.#withServer(async (conn) => {
      const server = await this.#serverStatement(conn, st);
      if (!('id' in server)) return server;
      payload.writeUInt32LE(server.id, 1);
      const run = conn.run(frame(0, payload), 'result', this.#socket);
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
      this.#send(a.bytes!);
      return a;
    }
    const server = { id: ok.id, params: ok.params };
    remember(conn, st.key, server);
    return server;
  }

  #resetSession(): void {
    this.#dropSession();
    this.#send(okPacket(1, STATUS.AUTOCOMMIT));
  }

  /** Forgets the client's statements and session state; its server connection (if kept) goes back reset. */
  #dropSession(): void {
    this.#lastPrepared = 0;
    this.#statements.clear();
    this.#unpin(PIN_MASK);
    const conn = this.#conn;
    if (conn) {
      this.#conn = null;
      this.#deps.servers.reset(this.#pool ?? undefined, conn);
      this.#settle('proxied', 200);
    }
  }

  /**
   * KILL [QUERY] <id>: `id` is a greeting id. Only the client's own sessions may be named: the same pool
   * logged in with the same key (the mariadb CLI's Ctrl-C and the connectors' destroy() send KILL from a
   * second connection with the same credentials), as a server lets a user kill only its own threads. Any
   * other id is 1094, as the server answers for a thread that does not exist. KILL QUERY stops the
   * statement the session is running (KILL QUERY upstream, from a separate server connection);
   * KILL [CONNECTION] ends the session (its statement killed upstream, its transaction rolled back).
   */
  #kill(k: KillRequest): void {
    if (k.kind === 'unmapped') {
      return this.#send(wireError(1, 'notSupported', 'poolgate maps only KILL [CONNECTION | QUERY] <connection id>, sent alone; KILL USER, KILL QUERY ID and KILL inside PREPARE, EXECUTE IMMEDIATE or with other statements are not supported'));
    }
    const target = k.id === null ? this : this.#deps.sessions.byId(k.id);
    if (!target || !target.#ownedBy(this)) return this.#send(wireError(1, 'unknownThread', `Unknown thread id: ${k.id}`));
    // KILL QUERY CONNECTION_ID() interrupts the KILL itself, as the server answers it.
    if (k.kind === 'query' && k.id === null) return this.#send(errPacket(1, 1317, '70100', 'Query execution was interrupted'));
    if (k.kind === 'connection' && target === this) {
      // Its own connection: ended after ER_CONNECTION_KILLED, as the server does.
      if (this.#session) this.#session.reason ??= 'client_terminated';
      this.#socket.end(errPacket(1, 1927, '70100', 'Connection was killed'));
      this.close();
      return;
    }
    if (k.kind === 'query') {
      target.#killQuery();
      this.#send(okPacket(1, this.#status()));
      return;
    }
    this.#send(okPacket(1, this.#status()));
    target.close();
  }

  /** Whether `other` logged in to the same pool with the same key (or both without one). */
  #ownedBy(other: ClientSession): boolean {
    return this.#phase === 'command' && this.#pool !== null && other.#pool !== null && this.#pool.id === other.#pool.id && this.#keyHash === other.#keyHash;
  }

  /** Stops the statement running now, if any (its server connection is not reused: a late KILL QUERY could land on the next one). */
  #killQuery(): void {
    const running = this.#running;
    if (running && this.#pool) void this.#deps.servers.killQuery(this.#pool, running, false);
  }

  /** The pool as the current snapshot has it, checked again on every admission (suspension, key revocation). */
  #livePool(): PoolEntry | string {
    const snap = this.#deps.snapshots.current;
    if (this.#lastCheck.holds(snap, this.#deps.clock)) return this.#pool!;
    const pool = snap.pools.get(this.#pool!.subdomain.toLowerCase());
    if (!pool || pool.id !== this.#pool!.id || pool.backend !== 'mysql') return 'the pool no longer exists';
    if (pool.status !== 'active') return 'the pool is suspended';
    let expiresAt: number | null = null;
    if (this.#keyHash !== null) {
      const key = liveKey(snap.keys, this.#keyHash, pool.id, this.#deps.clock());
      if (key === null) return 'the pool key was revoked or has expired';
      expiresAt = key.expiresAt;
    } else if (pool.requireKey) return 'the pool now requires a key';
    this.#pool = pool;
    this.#lastCheck.passed(snap, expiresAt);
    return pool;
  }

  /**
   * Runs one command on a server connection: the transaction's own, or one taken (with a slot) for it.
   * Afterwards both are kept while the server reports a transaction (or autocommit off), else given back.
   */
  async #withServer(work: (conn: ServerConn) => Promise<Answer>): Promise<void> {
    let conn = this.#conn;
    if (conn && conn.clean) {
      // Pinned outside a transaction, maybe for long: the key and pool are checked at each statement still.
      const pool = this.#livePool();
      if (typeof pool === 'string') return this.#fail(1, 'accessDenied', pool);
    }
    if (!conn) {
      const pool = this.#livePool();
      if (typeof pool === 'string') return this.#fail(1, 'accessDenied', pool);
      const signature = poolSignature(pool);
      if (signature === null) {
        this.#logRefusal('request refused', 'cannotConnect', 'the pool has no database role attached');
        return this.#send(wireError(1, 'cannotConnect', 'the pool has no database role attached'));
      }
      const started = performance.now();
      let admission = this.#deps.governor.acquire({ poolId: pool.id, waitMs: pool.settings.queueTimeoutMs, abortable: this.#abortable });
      if (admission instanceof Promise) admission = await admission;
      // Counted as queued only when the governor really queued it (a Redis answer is always a promise).
      this.#waited = admission.queued === true;
      this.#queuedMs = admission.queuedMs;
      if (!admission.ok) {
        // Counted as the HTTP data plane counts the same refusal (429, 504 queue timeout, 503 unavailable);
        // a client that left while queued gets nothing.
        const counted = refusalReply(admission, NO_HEADERS);
        if (!counted) return this.#record(pool, 'client_aborted', 0, admission);
        this.#record(pool, counted.error, counted.status, admission);
        this.#logRefusal('request refused', admission.reason, `no slot: ${admission.reason} after ${Math.round(performance.now() - started)} ms`);
        return this.#send(refusalError(1, admission.reason, pool.subdomain, performance.now() - started));
      }
      if ((this.#phase as Phase) === 'closed') {
        admission.permit.release({ dropped: true });
        return;
      }
      this.#permit = admission.permit;
      this.#admission = admission;
      this.#heldSince = performance.now();
      try {
        conn = await this.#deps.servers.checkout(pool, signature, this.#variant, this.#collation);
      } catch (err) {
        this.#settle('upstream_unreachable', 502);
        this.#logRefusal('upstream unreachable', 'cannotConnect', (err as Error).message);
        return this.#send(wireError(1, 'cannotConnect', `cannot reach the database: ${(err as Error).message}`));
      }
      if ((this.#phase as Phase) === 'closed') {
        this.#deps.servers.checkin(this.#pool ?? undefined, conn, true);
        this.#settle('client_aborted', 0);
        return;
      }
      this.#conn = conn;
    }
    this.#running = conn;
    // Each command must end within the pool's request timeout; then it is killed upstream.
    const pool = this.#pool!;
    const deadline = setTimeout(() => void this.#deps.servers.killQuery(pool, conn), pool.settings.requestTimeoutMs);
    try {
      await work(conn);
    } catch (err) {
      clearTimeout(deadline);
      if (!(err instanceof ServerLost)) throw err;
      this.#running = null;
      this.#conn = null;
      // The client left mid-command (close() cut the server connection): nothing was lost upstream.
      if ((this.#phase as Phase) === 'closed') return;
      const hadState = this.#pins !== 0;
      this.#unpin(PIN_MASK);
      this.#settle('upstream_aborted', 502);
      this.#logRefusal('upstream lost', 'lostConnection', 'lost connection to the database during the command');
      // Bytes of a result already went out: no clean ERR can follow them. In session mode the session is gone.
      if (err.forwarded) this.close();
      else if (this.#sessionMode) this.#fail(1, 'lostConnection', 'Lost connection to the database during the command; the session (wirePoolMode session) ended');
      else this.#send(wireError(1, 'lostConnection', `Lost connection to the database during the command; any open transaction was rolled back${hadState ? ' and the session state (variables, temporary tables, locks) is gone' : ''}`));
      return;
    }
    clearTimeout(deadline);
    this.#running = null;
    if ((this.#phase as Phase) === 'closed') return;
    if (!conn.alive) {
      // Gone after its answer: whatever it held is gone with it.
      this.#unpin(PIN_MASK);
    }
    if (this.#sessionMode && conn.alive) {
      // wirePoolMode 'session': the client keeps its server connection (and slot) until it leaves, as if
      // connected to the database itself; the hold is no latency sample.
      this.#conn = conn;
      this.#heldPinned = true;
      this.#keep(conn);
      return;
    }
    if (!conn.alive || (conn.clean && this.#pins === 0)) {
      this.#conn = null;
      this.#deps.servers.checkin(this.#pool ?? undefined, conn, true);
      this.#settle('proxied', 200);
    } else if (conn.clean) {
      // Pinned by session state outside a transaction: the connection and the slot stay with the client
      // until the state is gone or it leaves (no idle limit: the state is the client's to keep).
      this.#conn = conn;
      this.#keep(conn);
    } else {
      // A transaction holds a slot: it may wait for its next statement at most the pool's request timeout.
      const ms = this.#pool!.settings.requestTimeoutMs;
      this.#idleTimer = setTimeout(() => {
        this.#idleTimer = null;
        this.#fail(0, 'idleInTransaction', `the transaction was idle for over ${ms} ms (the pool's request timeout) and was rolled back`);
      }, ms);
    }
  }

  /**
   * A server session kept for this client's state that the server ends between statements (wait_timeout,
   * a KILL from elsewhere, a restart) ends the client's session too, as a direct connection would end: its
   * state is gone, and the client learns it at once rather than at its next statement.
   */
  #keep(conn: ServerConn): void {
    conn.onLostWhileKept = () => {
      if (this.#conn !== conn || this.#running || (this.#phase as Phase) === 'closed') return;
      this.#deps.log.info({ event: 'mysqlwire', outcome: 'server_session_ended', pool: this.#pool?.subdomain }, 'mysqlwire: the server ended a session kept for a client between statements; the client session ends too');
      if (this.#session) this.#session.reason ??= 'server_session_ended';
      this.#conn = null;
      this.#unpin(PIN_MASK);
      this.#settle('upstream_aborted', 502);
      this.close();
    };
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
    if (this.#pool) this.#record(this.#pool, outcome, status, this.#admission, latencyMs);
    if (this.#session && outcome === 'proxied') this.#session.transactions++;
  }

  #record(pool: PoolEntry, outcome: OutcomeName, status: number, admission: Parameters<DataplaneMetrics['record']>[0]['admission'], upstreamMs: number | null = null): void {
    this.#deps.metrics?.record({ poolId: pool.id, pool: pool.subdomain, status, outcome, admission, waited: this.#waited, queuedMs: this.#queuedMs, upstreamMs });
  }

  /** Ends the session: a running command's server connection is cut; a transaction is rolled back and its connection reset. */
  close(): void {
    if (this.#phase === 'closed') return;
    this.#phase = 'closed';
    if (this.#loginTimer) clearTimeout(this.#loginTimer);
    if (this.#idleTimer) clearTimeout(this.#idleTimer);
    this.#abort.abort();
    this.#socket.destroy();
    const running = this.#running;
    const conn = this.#conn;
    this.#conn = null;
    if (running) {
      // The statement is stopped upstream too: a cut connection alone leaves it running on the server.
      if (this.#pool && running.busy) void this.#deps.servers.killQuery(this.#pool, running, false);
      running.destroy();
    } else if (conn) {
      this.#deps.servers.reset(this.#pool ?? undefined, conn);
    }
    this.#unpin(PIN_MASK);
    this.#settle(conn && conn.clean && !running ? 'proxied' : 'client_aborted', conn && conn.clean && !running ? 200 : 0);
    this.#onClose(this);
    const s = this.#session;
    if (s) {
      this.#deps.wireLog?.ended({
        pool: this.#pool?.subdomain ?? null, peer: s.peer, user: s.user, durationMs: Math.round(performance.now() - s.start),
        bytesIn: this.#socket.bytesRead ?? 0, bytesOut: this.#socket.bytesWritten ?? 0, transactions: s.transactions, reason: s.reason ?? 'client_disconnected',
      });
    }
  }
}
