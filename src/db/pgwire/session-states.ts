// The states of one PostgreSQL client connection (client-conn.ts), what each waits for and where it may go
// next: every transition the connection makes is checked against this one table, as pgbouncer's SocketState
// does ("each state corresponds to a list"). The extended-query bookkeeping inside a state (answers owed,
// an open batch) is counted, not a state: it changes with every message (session-protocol.ts).

export type State =
  /** Before login: the startup packet, or an SSLRequest, GSSENCRequest or CancelRequest before it. */
  | 'startup'
  /** An SSLRequest was accepted (or a ClientHello came first): the TLS handshake runs; nothing else may come. */
  | 'tls'
  /** AuthenticationCleartextPassword sent: waiting for the password message (the pool key). */
  | 'password'
  /** The key is accepted: the pool's first server connection, the session's link, BackendKeyData are under way. */
  | 'joining'
  /** Logged in, no server connection (transaction mode, between transactions): a message starts a link. */
  | 'idle'
  /** A slot or a server connection is being waited for: the client is paused, its messages queue. */
  | 'waiting'
  /** Linked to a server connection: messages pass through to it. */
  | 'active'
  /** Linked, and the server is in COPY FROM STDIN: CopyData up to CopyDone or CopyFail. */
  | 'copyIn'
  /** A batch was refused here: its messages are dropped up to its Sync (answered here). */
  | 'skipping'
  /** The server connection was lost inside the client's transaction: its next batch gets the error. */
  | 'lost'
  /** The client's Terminate went to the server behind answers still owed: their answers, then the close. */
  | 'terminating'
  | 'closed';

export interface StateSpec {
  /** What the connection waits for from the client (quoted in the error for a message not legal in it). */
  waitsFor: string;
  /** A login state: its errors are logged as login refusals. */
  login: boolean;
  /** The states it may go to ('closed' is always allowed). */
  next: readonly State[];
}

export const STATES: Readonly<Record<State, StateSpec>> = {
  startup: { waitsFor: 'a startup packet, SSLRequest, GSSENCRequest or CancelRequest', login: true, next: ['tls', 'password'] },
  tls: { waitsFor: 'the TLS handshake', login: true, next: ['startup'] },
  password: { waitsFor: 'a password message with the pool key', login: true, next: ['joining'] },
  joining: { waitsFor: 'the login to finish; messages wait', login: true, next: ['idle', 'active'] },
  idle: { waitsFor: 'a Query, an extended-query batch, Sync or Terminate', login: false, next: ['waiting', 'active', 'skipping'] },
  waiting: { waitsFor: 'a slot and a server connection; messages wait', login: false, next: ['active', 'idle', 'skipping'] },
  active: { waitsFor: 'messages to pass to its server connection', login: false, next: ['idle', 'copyIn', 'skipping', 'lost', 'terminating'] },
  copyIn: { waitsFor: 'CopyData, CopyDone or CopyFail', login: false, next: ['active', 'skipping', 'lost', 'terminating'] },
  skipping: { waitsFor: 'the Sync that ends the refused batch', login: false, next: ['active', 'idle', 'lost'] },
  lost: { waitsFor: 'the next batch, to report the lost transaction', login: false, next: ['idle'] },
  terminating: { waitsFor: "the server's last answers and its close", login: false, next: [] },
  closed: { waitsFor: 'nothing', login: false, next: [] },
};

/** The message of an error for a message not legal in `state`: what it was, and what the connection waited for. */
export function illegalMessage(state: State, what: string): string {
  return `${what} (the session was waiting for ${STATES[state].waitsFor})`;
}

/** Whether `from` may go to `to` (a bug otherwise: the connection is closed, never left half-way). */
export function legalTransition(from: State, to: State): boolean {
  return to === 'closed' ? from !== 'closed' : STATES[from].next.includes(to);
}

/** The message types a client may send once logged in (PostgreSQL ends the session on any other). */
const FRONTEND = new Uint8Array(256);
for (const c of 'BCdcfDEHFPQSX') FRONTEND[c.charCodeAt(0)] = 1;

/** Whether `type` is a frontend message type (the PasswordMessage 'p' only during login). */
export function isFrontendType(type: number): boolean {
  return FRONTEND[type] === 1;
}

/** How an unknown message type is named in its error, as PostgreSQL names it. */
export function unknownType(type: number): string {
  return `invalid frontend message type ${type}`;
}
