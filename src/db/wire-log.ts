// The wire listeners' log (issue 20): refusals, failed logins, queue timeouts and upstream errors always (warn);
// successful logins one in `sample` (info, like the HTTP access log's accessLogSample; 0: none). Never a password
// or key: only the pool, the peer address, the client's user name and the error poolgate sent.
import type { Logger } from '../log.js';

export interface WireEvent {
  pool?: string | null;
  peer: string;
  user?: string;
  /** SQLSTATE (PostgreSQL) or error name (MySQL) sent to the client. */
  code?: string;
  message?: string;
}

export class WireLog {
  readonly #log: Logger;
  readonly #protocol: 'pgwire' | 'mysqlwire';
  readonly #sample: number;
  #logins = 0;

  constructor(log: Logger, protocol: 'pgwire' | 'mysqlwire', sample: number) {
    this.#log = log;
    this.#protocol = protocol;
    this.#sample = sample;
  }

  /** A refusal or error sent to the client (login failed, queue timeout, upstream unreachable, lost connection). */
  refused(what: string, e: WireEvent): void {
    this.#log.warn({ event: this.#protocol, outcome: what, ...e }, `${this.#protocol}: ${what}${e.pool ? ` (pool ${e.pool})` : ''}: ${e.message ?? e.code ?? ''}`);
  }

  /** A successful login, logged one in `sample`; true when it was (its session's end is logged then too). */
  loggedIn(e: WireEvent): boolean {
    if (this.#sample === 0 || ++this.#logins % this.#sample !== 0) return false;
    this.#log.info({ event: this.#protocol, outcome: 'login', ...e }, `${this.#protocol}: login to pool ${e.pool ?? ''}`);
    return true;
  }

  /** The end of a session whose login was logged: how long, how much, how many transactions, and why it ended. */
  ended(e: WireEvent & SessionEnd): void {
    this.#log.info(
      { event: this.#protocol, outcome: 'session_end', ...e },
      `${this.#protocol}: session on pool ${e.pool ?? ''} ended (${e.reason}) after ${(e.durationMs / 1000).toFixed(1)} s, ` +
        `${e.transactions} transactions, ${e.bytesIn} bytes in, ${e.bytesOut} bytes out`,
    );
  }
}

export interface SessionEnd {
  durationMs: number;
  /** Bytes from the client and to it, on its socket (TLS records included). */
  bytesIn: number;
  bytesOut: number;
  /** Transactions (an autocommitted statement is one) that finished in the session. */
  transactions: number;
  /** client_terminated (Terminate/COM_QUIT), client_disconnected, or the error sent before closing (its code). */
  reason: string;
}
