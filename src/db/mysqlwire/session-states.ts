// The states of one MySQL client session (client-session.ts), what each waits for, which packets are legal in
// it and where it may go next: every transition the session makes is checked against this one table, as
// pgbouncer's SocketState does ("each state corresponds to a list").

export type State =
  /** Greeted (or about to be): waiting for the HandshakeResponse, or an SSLRequest before it. */
  | 'handshake'
  /** Asked the client to switch to caching_sha2_password at login: waiting for its scramble. */
  | 'authSwitch'
  /** Logged in, no command running: waiting for the next command, a packet with sequence id 0. */
  | 'idle'
  /** A command runs upstream: the client's next packets wait unread (pipelined commands run in order). */
  | 'running'
  /** The server asked for a LOCAL INFILE file (of the client's own COM_QUERY): file packets, up to an empty one. */
  | 'infile'
  /** COM_CHANGE_USER answered with an auth switch: waiting for the client's scramble over the new nonce. */
  | 'changeUser'
  | 'closed';

export interface StateSpec {
  /** What the session waits for from the client. */
  waitsFor: string;
  /** Whether the client's packets are read now (otherwise they wait buffered). */
  reads: boolean;
  /** A login exchange: its errors are logged as login refusals, an oversized packet is a bad handshake. */
  login: boolean;
  /** The states it may go to ('closed' is always allowed). */
  next: readonly State[];
}

export const STATES: Readonly<Record<State, StateSpec>> = {
  handshake: { waitsFor: 'a HandshakeResponse or an SSLRequest', reads: true, login: true, next: ['authSwitch', 'idle'] },
  authSwitch: { waitsFor: 'the auth switch response with the scramble', reads: true, login: true, next: ['idle'] },
  idle: { waitsFor: 'a command, sequence id 0', reads: true, login: false, next: ['running', 'changeUser'] },
  running: { waitsFor: "the server's answer; client packets wait", reads: false, login: false, next: ['idle', 'infile'] },
  infile: { waitsFor: 'LOCAL INFILE file packets up to the empty one', reads: true, login: false, next: ['running', 'idle'] },
  changeUser: { waitsFor: 'the auth switch response to COM_CHANGE_USER', reads: true, login: true, next: ['idle'] },
  closed: { waitsFor: 'nothing', reads: false, login: false, next: [] },
};

/** The message of an ERR for a packet not legal in `state`: what it was, and what the session waited for. */
export function illegalPacket(state: State, what: string): string {
  return `${what} (the session was waiting for ${STATES[state].waitsFor})`;
}

/** Whether `from` may go to `to` (a bug otherwise: the session is closed, never left half-way). */
export function legalTransition(from: State, to: State): boolean {
  return to === 'closed' ? from !== 'closed' : STATES[from].next.includes(to);
}

/**
 * What handling a packet answers: nothing (done, or answered at once), a promise that settles when the command
 * has ended, or STARTED: the command runs upstream and the session hears its end through commandEnded().
 */
export const STARTED: unique symbol = Symbol('started');
export type Command = void | Promise<void> | typeof STARTED;
