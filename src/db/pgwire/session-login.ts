// The login part of a PostgreSQL client connection: the startup packet (and the SSLRequest, GSSENCRequest or
// CancelRequest before it), the pool it names, the pool key as a cleartext password, the pool's first server
// connection, and the pool and key checked again before each link. It owns who the client is; the link and
// protocol parts read it.
import { performance } from 'node:perf_hooks';
import { TLSSocket } from 'node:tls';
import { liveKey } from '../../pool-request/authenticate.js';
import type { PoolEntry, Snapshot } from '../../pool-request/snapshot.js';
import { sha256Hex } from '../../security/tokens.js';
import { cstring } from './frames.js';
import { AUTH_CLEARTEXT, AUTH_OK, backendKeyData, parameterStatus, readyForQuery, SSL_NO } from './messages.js';
import { fatal, SQLSTATE } from './errors.js';
import { poolFromServerName, poolFromUser, readFirstPacket, readOptions } from './startup.js';
import { notASetting, reported, settingName, trackedName } from './session-params.js';
import type { ServerPool } from './server-pool.js';
import { LastCheck } from '../wire-recheck.js';
import type { ConnWire } from './client-conn.js';
import type { Link } from './session-link.js';

const PW = 0x70;

export class Login {
  readonly #wire: ConnWire;
  #link!: Link;
  /** The user name the client gave (logged with its refusals; never checked). */
  user: string | undefined;
  /** The TLS server name the client asked for (SNI), which may name the pool. */
  servername: string | null = null;
  #timer: NodeJS.Timeout | null;
  /** The pool the client logged in to, as the last recheck found it; null before the startup packet named one. */
  pool: PoolEntry | null = null;
  /** The pool's name as the snapshot keys it. */
  #poolName = '';
  #keyHash = '';
  /** wirePoolMode 'session': one server connection for the whole session. */
  session = false;
  /** The pool's server connections; null before the password was accepted. */
  servers: ServerPool | null = null;
  /** Session parameters the client set at login (startup packet or options), by the server's spelling. */
  #fromClient = new Map<string, string>();
  /**
   * Settings given at login that poolgate does not track (startup parameters, options -c): applied on the
   * client's first server connection by set_config (session-link.ts); null when none, or once taken.
   */
  settings: Map<string, string> | null = null;
  /** When the check that this client may still use its pool last passed (recheck()). */
  readonly #lastCheck = new LastCheck();
  /** When the logged login finished (null: this session's login was not logged, nor is its end). */
  loggedAt: number | null = null;

  constructor(wire: ConnWire) {
    this.#wire = wire;
    this.#timer = setTimeout(() => wire.fatal(SQLSTATE.protocolViolation, 'login timed out'), wire.ctx.loginTimeoutMs);
    this.#timer.unref();
  }

  /** The link part (made after this one: it reads the login). */
  set link(link: Link) {
    this.#link = link;
  }

  /** Ends the login timer (logged in, or the connection closed). */
  stop(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
  }

  /** State 'startup': the first packet (untyped). */
  first(packet: Buffer): void {
    const w = this.#wire;
    const p = readFirstPacket(packet);
    switch (p.kind) {
      case 'bad':
        return w.illegal(p.message.startsWith('unsupported') ? SQLSTATE.featureNotSupported : SQLSTATE.protocolViolation, p.message);
      case 'gssenc':
        w.send(SSL_NO);
        return;
      case 'cancel':
        w.ctx.cancel(p.pid, p.secret);
        return w.end();
      case 'ssl':
        if (!w.ctx.tls || w.socket instanceof TLSSocket) {
          w.send(SSL_NO);
          return;
        }
        return w.startTls();
      case 'startup':
        return this.#startup(p.params);
    }
  }

  #startup(params: Map<string, string>): void {
    const w = this.#wire;
    this.user = params.get('user');
    if (params.get('replication') && params.get('replication') !== 'false' && params.get('replication') !== 'off') {
      return w.fatal(SQLSTATE.featureNotSupported, 'replication connections are not supported by poolgate');
    }
    const fromOptions = readOptions(params.get('options'));
    if ('error' in fromOptions) return w.fatal(SQLSTATE.featureNotSupported, fromOptions.error);
    for (const [name, value] of params) {
      const tracked = trackedName(name);
      if (tracked) this.#fromClient.set(tracked, value);
      else if (!notASetting(name)) {
        // Never dropped silently: applied (pinning the client for it), or the login refused.
        if (!settingName(name)) return w.fatal(SQLSTATE.featureNotSupported, `startup parameter ${JSON.stringify(name)} is not a configuration parameter name`);
        (this.settings ??= new Map()).set(name, value);
      }
    }
    // `-c` settings in options win, as they do on PostgreSQL.
    for (const [name, value] of fromOptions.settings) this.#fromClient.set(name, value);
    for (const [name, value] of fromOptions.others) (this.settings ??= new Map()).set(name, value);
    const snap = w.ctx.snapshot();
    // SNI, then options; only when neither names a pool does `user` (otherwise ignored: sessions run as the pool's role).
    const sub = poolFromServerName(this.servername, w.ctx.poolDomain) ?? fromOptions.pool ?? poolFromUser(this.user, snap.pools);
    if (!sub) {
      const how = `log in as user=<subdomain> (PGUSER), connect to <subdomain>.${w.ctx.poolDomain} with TLS, or set options=pool=<subdomain> (PGOPTIONS='pool=<subdomain>')`;
      // An unknown user is refused as PostgreSQL refuses an unknown role (28000); it tells no more than options=pool= does.
      if (this.user) return w.fatal(SQLSTATE.invalidAuthorization, `no pool named: user ${JSON.stringify(this.user)} is not a pool; ${how}`);
      return w.fatal(SQLSTATE.rejectedEstablishment, `no pool named: ${how}`);
    }
    this.#poolName = sub.toLowerCase();
    const pool = snap.pools.get(this.#poolName);
    if (!pool) return w.fatal(SQLSTATE.unknownPool, `pool ${JSON.stringify(sub)} does not exist`);
    if (pool.backend !== 'postgres') return w.fatal(SQLSTATE.rejectedEstablishment, `pool ${pool.subdomain} is not a PostgreSQL pool`);
    this.pool = pool;
    // The rest of this chunk may already hold the password: the same reader goes on, typed from here.
    w.readTyped();
    w.enter('password');
    w.send(AUTH_CLEARTEXT);
  }

  /** State 'password': the password message, whose password is the pool key. */
  password(type: number, frame: Buffer): void {
    const w = this.#wire;
    if (type !== PW) return w.illegal(SQLSTATE.protocolViolation, 'expected a password message');
    const pw = cstring(frame, 5);
    if (!pw || pw.next !== frame.length) return w.illegal(SQLSTATE.protocolViolation, 'malformed password message');
    const pool = this.pool!;
    this.#keyHash = sha256Hex(pw.value);
    const refusal = this.#admissible(pool, w.ctx.snapshot());
    if (refusal) return w.fatalRaw(refusal);
    const servers = w.ctx.servers.forPool(pool);
    if (typeof servers === 'string') return w.fatal(SQLSTATE.rejectedEstablishment, `pool ${pool.subdomain}: ${servers}`);
    this.servers = servers;
    this.session = pool.settings.wirePoolMode === 'session';
    w.enter('joining');
    w.pause();
    this.#finish(servers).catch(w.crashed);
  }

  /**
   * Why this client may not use the pool now (a FATAL to send), or null, recorded in #lastCheck as a pass.
   * Checked at login and at a link when something it reads may have changed (recheck()).
   */
  #admissible(pool: PoolEntry, snap: Snapshot): Buffer | null {
    const w = this.#wire;
    const key = liveKey(snap.keys, this.#keyHash, pool.id, w.ctx.clock());
    if (key === null) {
      return fatal(SQLSTATE.invalidPassword, `password authentication failed for pool ${pool.subdomain}: the password must be a live key of this pool`);
    }
    if (key.access !== 'write') return fatal(SQLSTATE.invalidAuthorization, 'read keys cannot open wire connections; use a write key');
    if (pool.status !== 'active') return fatal(SQLSTATE.rejectedEstablishment, `pool ${pool.subdomain} is suspended`);
    const r = w.ctx.policies?.wireRefusal(pool, key, w.address, 'POSTGRES') ?? null;
    if (r === null) {
      this.#lastCheck.passed(snap, key.expiresAt);
      return null;
    }
    if (r.reason === 'needs_http') return fatal(SQLSTATE.invalidAuthorization, `pool ${pool.subdomain} requires ${r.policy}, which wire connections cannot carry`);
    return fatal(SQLSTATE.invalidAuthorization, 'this client address is not allowed on this pool');
  }

  /** State 'joining': the pool's first server connection, the session's link, the keys; then AuthenticationOk. */
  async #finish(servers: ServerPool): Promise<void> {
    const w = this.#wire;
    // The first login of a pool opens a server connection: it proves the upstream works and gives the parameters.
    if (!servers.params) {
      try {
        const conn = await servers.acquire();
        servers.release(conn, 'none');
      } catch (err) {
        return w.fatal(SQLSTATE.upstreamUnavailable, `cannot connect to the database of pool ${this.pool!.subdomain}: ${(err as Error).message}`);
      }
      if (w.state === 'closed') return;
    }
    const link = this.#link;
    link.wanted = servers.wanted(this.#fromClient);
    if (this.session) {
      const linked = await link.link();
      if (linked !== true) {
        if (linked) w.fatal(linked.code, linked.message);
        return;
      }
    }
    if (w.state === 'closed') return;
    link.register();
    const out = [AUTH_OK];
    // The server's parameters as this client will have them.
    for (const [k, v] of servers.params ?? []) if (reported(k)) out.push(parameterStatus(k, link.wanted.get(k) ?? v));
    out.push(backendKeyData(link.pid, link.secret), readyForQuery('I'));
    w.send(Buffer.concat(out));
    this.stop();
    if (w.ctx.wireLog.loggedIn({ pool: this.pool!.subdomain, peer: w.address, user: this.user })) this.loggedAt = performance.now();
    w.loggedIn();
  }

  /** The pool as the current snapshot has it, after checking this client may still use it; null (and closed) if not. */
  recheck(): PoolEntry | null {
    const w = this.#wire;
    const snap = w.ctx.snapshot();
    if (this.#lastCheck.holds(snap, w.ctx.clock)) return this.pool;
    const pool = snap.pools.get(this.#poolName);
    if (!pool || pool.id !== this.pool!.id) {
      w.fatal(SQLSTATE.unknownPool, `pool ${this.pool!.subdomain} no longer exists`);
      return null;
    }
    const refusal = this.#admissible(pool, snap);
    if (refusal) {
      w.fatalRaw(refusal);
      return null;
    }
    this.pool = pool;
    return pool;
  }
}
