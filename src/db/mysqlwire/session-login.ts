// The login part of a MySQL client session: the greeting, the handshake (TLS upgrade, auth switch), the
// pool key checked with caching_sha2_password, COM_CHANGE_USER, and the pool and key checked again on each
// admission. It owns who the client is; the link and protocol parts read it.
import type { Greeting } from './server-identity.js';
import type { KeyEntry, PoolEntry } from '../../pool-request/snapshot.js';
import { liveKey } from '../../pool-request/authenticate.js';
import { TLSSocket } from 'node:tls';
import type { Packet } from './frame-reader.js';
import { BASE_CAPABILITIES, CLIENT, MARIADB, STATUS, VARIANT_CAPABILITIES, VARIANT_MARIADB_METADATA, authSwitchPacket, frame, handshakePacket, okPacket, readNulString } from './packets.js';
import { parseHandshakeResponse, type HandshakeResponse } from './client-handshake.js';
import { makeNonce, scrambleMatches } from './scramble.js';
import { wireError, type WireError } from './wire-errors.js';
import { poolSignature } from './server-pool.js';
import { LastCheck } from '../wire-recheck.js';
import type { SessionWire } from './client-session.js';

/** Handshake packets are small; a client must finish logging in within this. */
const LOGIN_TIMEOUT_MS = 10_000;

export class Login {
  readonly #wire: SessionWire;
  #nonce = makeNonce();
  #hello: HandshakeResponse | null = null;
  #timer: NodeJS.Timeout | null;
  /** Capabilities (classic, MariaDB's) the greeting offered: the client may take some. */
  #offered = 0;
  #offeredMariadb = 0;
  /** Capabilities of the client's server connections (VARIANT_CAPABILITIES it took; SET_OPTION toggles multi statements). */
  variant = 0;
  collation = 45;
  /** The client took MariaDB's bulk operations (COM_STMT_BULK_EXECUTE). */
  bulk = false;
  #pool: PoolEntry | null = null;
  #keyHash: string | null = null;
  /** When recheck() last passed. */
  #lastCheck = new LastCheck();

  constructor(wire: SessionWire) {
    this.#wire = wire;
    this.#timer = setTimeout(() => wire.close(), LOGIN_TIMEOUT_MS);
    // Learned from the pools' servers (server-identity.ts); only while nothing is learned yet and a probe
    // runs does the greeting wait for it, at most GREETING_WAIT_MS (the client cannot speak first).
    const greeting = wire.deps.identity.greeting();
    if (greeting instanceof Promise) void greeting.then((g) => this.#greet(g));
    else this.#greet(greeting);
  }

  /** The pool the client logged in to (as the last recheck found it); null before login. */
  get pool(): PoolEntry | null {
    return this.#pool;
  }

  /** Whether `other` logged in to the same pool with the same key (or both without one). */
  sameAccount(other: Login): boolean {
    return this.#pool !== null && other.#pool !== null && this.#pool.id === other.#pool.id && this.#keyHash === other.#keyHash;
  }

  /** Ends the login timer (the session closed). */
  stop(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
  }

  #greet(g: Greeting): void {
    if (this.#wire.state !== 'handshake') return;
    this.#offeredMariadb = g.mariadbCapabilities;
    const caps = BASE_CAPABILITIES | CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS | CLIENT.LOCAL_FILES | g.capabilities | CLIENT.CONNECT_ATTRS | (this.#wire.deps.tls ? CLIENT.SSL : 0);
    this.#offered = caps;
    this.#wire.send(handshakePacket(g.version, this.#wire.id, this.#nonce, caps, STATUS.AUTOCOMMIT, g.mariadbCapabilities));
  }

  /** State 'handshake': the HandshakeResponse (or an SSLRequest before it). */
  handshake(p: Packet): void {
    const w = this.#wire;
    const h = parseHandshakeResponse(p.payload);
    if (!h) return w.illegal(p.seq + 1, 'badHandshake', 'bad handshake: not a HandshakeResponse');
    if (h.sslRequest) {
      if (!w.deps.tls || w.socket instanceof TLSSocket) return w.fail(p.seq + 1, 'badHandshake', 'TLS is not offered');
      w.upgrade();
      return;
    }
    this.#hello = h;
    this.variant = h.capabilities & VARIANT_CAPABILITIES & this.#offered;
    // Extended column metadata taken: its server connections are opened with it (upstream-login.ts).
    if ((h.mariadbCapabilities & this.#offeredMariadb & MARIADB.EXTENDED_METADATA) !== 0) this.variant |= VARIANT_MARIADB_METADATA;
    this.bulk = (h.mariadbCapabilities & this.#offeredMariadb & MARIADB.STMT_BULK_OPERATIONS) !== 0;
    this.collation = h.collation;
    // Any other plugin is asked to switch to caching_sha2_password, the one a key known by its hash can verify,
    // as MySQL does. That includes an empty answer under another plugin's name: libmariadb sends
    // `dummy_fallback_auth` when its caching_sha2_password plugin is not loaded yet (seen with sysbench's
    // threads connecting at once); by the switch it is. Only a client without plugin support is taken as is.
    const pluginAuth = (h.capabilities & CLIENT.PLUGIN_AUTH) !== 0;
    if (h.plugin === 'caching_sha2_password' || (!pluginAuth && h.auth.length === 0)) return this.authenticate(p.seq, h.auth);
    w.enter('authSwitch');
    w.send(authSwitchPacket(p.seq + 1, 'caching_sha2_password', this.#nonce));
  }

  /** The client's scramble (in the HandshakeResponse, or state 'authSwitch'): logged in, or refused and closed. */
  authenticate(seq: number, scramble: Buffer): void {
    const w = this.#wire;
    const h = this.#hello!;
    const snap = w.deps.snapshots.current;
    const name = h.user.toLowerCase();
    const pool = snap.pools.get(name);
    const denied = (why: string) => w.fail(seq + 1, 'accessDenied', `Access denied for user '${h.user}' (${why})`);
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
      return w.fail(seq + 1, 'dbAccessDenied', `Access denied for user '${h.user}' to database '${h.database}' (the pool's database is '${pool.database.name}')`);
    }
    const refused = this.#policyRefusal(pool, key);
    if (refused) return w.fail(seq + 1, refused[0], refused[1]);
    this.#pool = pool;
    this.#keyHash = keyHash;
    this.stop();
    w.loggedIn(h.user);
    // fast_auth_success, then OK.
    w.send(frame(seq + 1, Buffer.from([0x01, 0x03])));
    w.send(okPacket(seq + 2, STATUS.AUTOCOMMIT));
  }

  /** The live key of `pool` whose caching_sha2_password scramble (over the nonce) is `scramble`. */
  #keyFor(pool: PoolEntry, scramble: Buffer): [string, KeyEntry] | null {
    const now = this.#wire.deps.clock();
    for (const [hash, entry] of this.#wire.deps.snapshots.current.keys) {
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
  changeUser(p: Buffer): void {
    const w = this.#wire;
    const u = readNulString(p, 1);
    if (!u) return w.send(wireError(1, 'unknownCommand', 'malformed COM_CHANGE_USER'));
    const pool = this.#pool!;
    if (u[0].toLowerCase() !== pool.subdomain.toLowerCase()) {
      w.refused('change user refused', 'notSupported', `to user '${u[0]}'`);
      return w.send(wireError(1, 'notSupported', `COM_CHANGE_USER to another user ('${u[0]}') is not supported by poolgate: the user names the pool (${pool.subdomain}), and another pool needs another connection; this session is unchanged`));
    }
    let o = u[1];
    const authLen = p[o];
    if (authLen === undefined) return w.send(wireError(1, 'unknownCommand', 'malformed COM_CHANGE_USER'));
    o += 1 + authLen;
    const db = o < p.length ? readNulString(p, o) : null;
    if (db && db[0] !== '' && db[0] !== pool.database!.name) {
      return w.send(wireError(1, 'dbAccessDenied', `Access denied for user '${u[0]}' to database '${db[0]}' (the pool's database is '${pool.database!.name}'); this session is unchanged`));
    }
    if (db && db[1] + 2 <= p.length) this.collation = p[db[1]]!;
    this.#nonce = makeNonce();
    w.enter('changeUser');
    w.send(authSwitchPacket(1, 'caching_sha2_password', this.#nonce));
  }

  /** State 'changeUser': the client's scramble; the session is reset (a wrong key ends it, as a failed login). */
  changed(seq: number, scramble: Buffer): void {
    const w = this.#wire;
    const pool = this.#pool!;
    let keyHash: string | null = null;
    if (scramble.length > 0) {
      const found = this.#keyFor(pool, scramble);
      if (!found) return w.fail(seq + 1, 'accessDenied', `Access denied for user '${pool.subdomain}' (unknown pool or invalid key)`);
      keyHash = found[0];
    } else if (pool.requireKey) return w.fail(seq + 1, 'accessDenied', `Access denied for user '${pool.subdomain}' (the pool key is the password)`);
    this.#keyHash = keyHash;
    this.#lastCheck = new LastCheck();
    w.enter('idle');
    w.resetSession();
    w.send(frame(seq + 1, Buffer.from([0x01, 0x03])));
    w.send(okPacket(seq + 2, STATUS.AUTOCOMMIT));
  }

  /** The IP allowlist applies at login; HTTP-shaped policies (HMAC, JWT, access proxy) refuse wire clients. */
  #policyRefusal(pool: PoolEntry, key: KeyEntry | null): [WireError, string] | null {
    const peer = this.#wire.socket.remoteAddress ?? '';
    const r = this.#wire.deps.policies?.wireRefusal(pool, key, peer, 'MYSQL') ?? null;
    if (r === null) return null;
    if (r.reason === 'needs_http') return ['accessDenied', `the pool requires ${r.policy}, which MySQL clients cannot carry`];
    return ['hostNotAllowed', `Host '${peer}' is not allowed to use this pool`];
  }

  /** The pool as the current snapshot has it, checked again on every admission (suspension, key revocation). */
  recheck(): PoolEntry | string {
    const deps = this.#wire.deps;
    const snap = deps.snapshots.current;
    if (this.#lastCheck.holds(snap, deps.clock)) return this.#pool!;
    const pool = snap.pools.get(this.#pool!.subdomain.toLowerCase());
    if (!pool || pool.id !== this.#pool!.id || pool.backend !== 'mysql') return 'the pool no longer exists';
    if (pool.status !== 'active') return 'the pool is suspended';
    let expiresAt: number | null = null;
    if (this.#keyHash !== null) {
      const key = liveKey(snap.keys, this.#keyHash, pool.id, deps.clock());
      if (key === null) return 'the pool key was revoked or has expired';
      expiresAt = key.expiresAt;
    } else if (pool.requireKey) return 'the pool now requires a key';
    this.#pool = pool;
    this.#lastCheck.passed(snap, expiresAt);
    return pool;
  }
}
