// The link part of a PostgreSQL client connection: a governor slot and a server connection from the pool's
// upstream pool, taken for a transaction (transaction mode) or the whole session (session mode) and given
// back when it ends; the session state that keeps them (pins); the server connection's session parameters
// made the client's before it is used; the client's cancel keys. Every path that takes a slot or a server
// connection gives both back exactly once: unlink() at the end of a transaction, dropped() when the server
// connection is lost, release() when the client goes.
import { wireNow } from '../wire-clock.js';
import type { Admission, LazyAbortSignal, Permit } from '../../governor/governor.js';
import type { RequestRecord } from '../../pool-request/release.js';
import { refusalOutcome, refusalStatus } from '../../pool-request/refusal.js';
import type { PoolEntry } from '../../pool-request/snapshot.js';
import { query } from './messages.js';
import { refusal, SQLSTATE } from './errors.js';
import { loginSettingsSql, setupQuery } from './session-params.js';
import type { ServerConn } from './server-conn.js';
import { ALL_PINS, PIN, PIN_REASONS } from './pinning.js';
import type { ConnWire } from './client-conn.js';
import type { Login } from './session-login.js';

/** Why no link was made (a slot refused, the server unreachable): the error the client gets. */
export interface LinkRefusal {
  code: string;
  message: string;
}

/** true: linked; a refusal to report; null: nothing to report (the client is gone, or was closed). */
export type LinkResult = true | LinkRefusal | null;

/**
 * Whether the client is gone, as the governor checks it at each link; the AbortController only once a wait
 * needs its signal (one per client: the governor drops its listener after each wait). A class, so every
 * client's has one shape: an object literal with a getter of its own has a shape per client, and the
 * governor's read of `aborted` went megamorphic.
 */
class ClientGone implements LazyAbortSignal {
  readonly #wire: ConnWire;
  #abort: AbortController | null = null;

  constructor(wire: ConnWire) {
    this.#wire = wire;
  }

  get aborted(): boolean {
    return this.#wire.state === 'closed';
  }

  signal(): AbortSignal {
    return (this.#abort ??= new AbortController()).signal;
  }

  abort(): void {
    this.#abort?.abort();
  }
}

export class Link {
  readonly #wire: ConnWire;
  readonly #login: Login;
  /** The slot held with the server connection. */
  #permit: Permit | null = null;
  /** The server connection linked to the client, if any. */
  server: ServerConn | null = null;
  #linkedAt = 0;
  #linkStarted = 0;
  /** The governor's grant behind #permit, recorded with the transaction it admitted. */
  #admission: Admission | null = null;
  #waited = false;
  #queuedMs = 0;
  /** What the governor checks: the client is gone (aborts a slot wait when the client leaves). */
  readonly #abortable: ClientGone;
  /**
   * Session state this client made on its server connection (PIN bits, transaction mode): while any is held,
   * the client keeps the connection and its slot between transactions (pinning.ts).
   */
  pins = 0;
  /** Pins no statement removes (settings given at login). */
  #stickyPins = 0;
  /**
   * The tracked parameters every server connection must have for this client (session-params.ts). Never
   * changed in place (replaced), so a server connection can remember which map it already matches; clients
   * that set none share their pool's.
   */
  wanted: ReadonlyMap<string, string> = new Map();
  /** The login settings' set_config, sent again after the client's own RESET ALL / DISCARD ALL (which return to login values on PostgreSQL). */
  loginSql: string | null = null;
  /** ReadyForQuery answers still owed to a SET we sent ahead of the client's messages (swallowed). */
  setupAnswers = 0;
  /** The first error one of those SETs got: the client is ended with it once they are all answered. */
  setupError: Buffer | null = null;
  /** The client's BackendKeyData (what a CancelRequest must name). */
  pid = 0;
  secret = 0;

  constructor(wire: ConnWire, login: Login) {
    this.#wire = wire;
    this.#login = login;
    this.#abortable = new ClientGone(wire);
  }

  /** Gives the client its BackendKeyData (the listener forgets it when the client leaves). */
  register(): void {
    const keys = this.#wire.ctx.register(this.#wire.self);
    this.pid = keys.pid;
    this.secret = keys.secret;
  }

  /**
   * Takes a slot and a server connection: synchronously when both are free (the common case), else a
   * promise, with the client paused meanwhile. The caller reports a refusal (to the batch, or FATAL at a
   * session-mode login).
   */
  link(): LinkResult | Promise<LinkResult> {
    const w = this.#wire;
    const pool = this.#login.recheck();
    if (!pool) return null;
    this.#linkStarted = wireNow();
    const admission = w.ctx.governor.acquire({ poolId: pool.id, waitMs: pool.settings.queueTimeoutMs, abortable: this.#abortable });
    const linked = admission instanceof Promise ? admission.then((a) => this.#admitted(pool, a, false)) : this.#admitted(pool, admission, true);
    if (!(linked instanceof Promise)) return linked;
    w.pause();
    return linked.finally(() => {
      if (w.state !== 'closed') w.resume();
    });
  }

  /** `sync`: admitted in the same call as link() started (no wait so far). */
  #admitted(pool: PoolEntry, admission: Admission, sync: boolean): LinkResult | Promise<LinkResult> {
    const w = this.#wire;
    this.#admission = admission;
    // Queued only when the governor really queued it (a Redis answer is always a promise).
    this.#waited = admission.queued === true;
    if (!admission.ok) {
      this.#record(pool, refusalOutcome(admission.reason), refusalStatus(admission.reason), null);
      if (w.state === 'closed') return null;
      return refusal(admission.reason, pool.subdomain, pool.settings.queueTimeoutMs);
    }
    const permit = admission.permit;
    if (w.state === 'closed') {
      permit.release({ dropped: true });
      return null;
    }
    const servers = this.#login.servers!;
    const got = servers.acquire();
    if (!(got instanceof Promise)) return this.#attach(pool, permit, got, sync);
    return got.then(
      (server) => this.#attach(pool, permit, server, false),
      (err: unknown) => {
        permit.release({ dropped: true });
        this.#record(pool, 'upstream_unreachable', 503, null);
        if (w.state === 'closed') return null;
        return { code: SQLSTATE.upstreamUnavailable, message: `cannot connect to the database of pool ${pool.subdomain}: ${(err as Error).message}` };
      },
    );
  }

  #attach(pool: PoolEntry, permit: Permit, server: ServerConn, sync: boolean): LinkResult {
    const gone = this.#wire.state === 'closed';
    if (gone || server.closed) {
      permit.release({ dropped: true });
      if (!server.closed) this.#login.servers!.release(server, 'none');
      return gone ? null : { code: SQLSTATE.upstreamLost, message: 'the server connection was lost before the transaction started' };
    }
    this.#login.pool = pool;
    this.#permit = permit;
    this.server = server;
    // Linked in the same call as link() started (no wait): the same instant, without a second clock read.
    this.#linkedAt = sync ? this.#linkStarted : wireNow();
    this.#queuedMs = this.#linkedAt - this.#linkStarted;
    server.link = this.#wire.self;
    const settings = this.#login.settings;
    if (settings !== null) {
      // Once, on the first server connection: the client stays on it for the rest of its session.
      const sql = loginSettingsSql(settings);
      this.#login.settings = null;
      this.loginSql = sql;
      if (!this.#login.session) {
        this.#stickyPins = PIN.set;
        this.pin(PIN.set);
      }
      this.setupAnswers++;
      server.write(query(sql));
      server.settledFor = null;
    }
    // The connection's session parameters made the client's, ahead of anything the client sends.
    if (server.settledFor !== this.wanted) {
      const setup = setupQuery(this.wanted, server.params);
      if (setup) {
        this.setupAnswers++;
        server.write(setup);
      } else server.settledFor = this.wanted;
    }
    return true;
  }

  /** The transaction is over: the server connection goes back idle and the slot is freed. */
  unlink(): void {
    const server = this.server!;
    const permit = this.#permit!;
    this.server = null;
    this.#permit = null;
    server.link = null;
    server.resume();
    this.#wire.serverWritable();
    const now = wireNow();
    this.#login.servers!.release(server, 'none', 0, now);
    const latencyMs = now - this.#linkedAt;
    permit.release({ latencyMs });
    this.#record(this.#login.pool!, 'proxied', 200, latencyMs);
  }

  /** The server connection closed under the client: it and the slot are forgotten (nothing to give back but the slot). */
  dropped(): void {
    this.setupAnswers = 0;
    this.setupError = null;
    const permit = this.#permit;
    this.server = null;
    this.#permit = null;
    permit?.release({ dropped: true });
    if (this.#wire.state !== 'closed' && this.#wire.state !== 'terminating') this.#record(this.#login.pool!, 'upstream_aborted', 502, null);
  }

  /**
   * The client is gone: a slot wait is aborted; the server connection is cleaned and goes back idle, or is
   * destroyed when work is still `owed` on it (a batch without its answer, a COPY FROM STDIN the server waits
   * on); the slot is freed.
   */
  release(owed: boolean): void {
    this.#abortable.abort();
    const server = this.server;
    const permit = this.#permit;
    this.server = null;
    this.#permit = null;
    if (server) {
      server.link = null;
      server.resume();
      const servers = this.#login.servers!;
      if (owed) servers.destroy(server);
      else servers.release(server, this.#login.session || this.pins !== 0 ? 'discard' : 'rollback', this.setupAnswers);
    }
    this.unpin(ALL_PINS, true);
    if (permit) {
      permit.release({ dropped: true });
      this.#record(this.#login.pool!, 'client_aborted', 499, null);
    }
  }

  /** Neither a slot nor a server connection is held past this transaction (transaction mode, nothing pinned). */
  get transient(): boolean {
    return !this.#login.session && this.pins === 0;
  }

  pin(bits: number): void {
    const added = bits & ~this.pins;
    if (added === 0) return;
    this.pins |= added;
    const m = this.#wire.ctx.pins;
    if (m) for (const reason of PIN_REASONS) if (added & PIN[reason]) m.pinned(this.#login.pool!.subdomain, reason);
  }

  /** `all`: the login settings' pin too (the client is gone). */
  unpin(bits: number, all = false): void {
    const removed = bits & this.pins & (all ? ALL_PINS : ~this.#stickyPins);
    if (removed === 0) return;
    this.pins &= ~removed;
    const m = this.#wire.ctx.pins;
    if (m) for (const reason of PIN_REASONS) if (removed & PIN[reason]) m.unpinned(this.#login.pool!.subdomain, reason);
  }

  /** A tracked parameter's value as the server spells it, or as the client's own SET left it. */
  keepWanted(name: string, value: string): void {
    if (!this.wanted.has(name) || this.wanted.get(name) === value) return;
    this.wanted = this.#login.servers!.shared(new Map(this.wanted).set(name, value));
  }

  /** Cancels the query running for this client (a CancelRequest naming its BackendKeyData). */
  cancelRunning(): void {
    this.server?.cancel();
  }

  #record(pool: PoolEntry, outcome: RequestRecord['outcome'], status: number, upstreamMs: number | null): void {
    this.#wire.ctx.metrics?.record({
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
}
