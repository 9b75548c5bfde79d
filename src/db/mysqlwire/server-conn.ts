// One logged-in upstream connection driven at the packet level: a command goes out as the client's
// bytes, and the answer streams back to the client socket untouched (or is collected, for poolgate's own
// commands) while a ResponseScanner finds its end and the server status flags.
import type { Socket } from 'node:net';
import type { LoggedIn } from './upstream-login.js';
import { directReads } from '../direct-reads.js';
import { DirectWriter } from '../direct-writes.js';
import { ResponseScanner, type ResponseKind } from './response-scanner.js';
import { STATUS } from './packets.js';

export interface Answer {
  /** It ended with an ERR packet. */
  error: boolean;
  /** Server status flags after the answer. */
  status: number;
  /** The whole answer, when it was collected rather than forwarded. */
  bytes: Buffer | null;
  /** It paused at a LOCAL INFILE request (relayed to the client): its file goes to send(), then follow(). */
  fileRequest?: boolean;
}

/** The connection broke (closed, killed, desynchronised) before the answer ended. */
export class ServerLost extends Error {
  constructor(readonly forwarded: boolean) {
    super('lost the connection to the database during the command');
  }
}

/**
 * Where a forwarded answer goes: the client connection's writer (direct-writes.ts), and its 'drain' when a
 * write was not taken whole.
 */
export interface Sink {
  write(bytes: Buffer): boolean;
  onDrain(f: () => void): void;
}

interface Job {
  /** A promise's (run(), follow()) or start()'s callbacks. */
  resolve(a: Answer): void;
  reject(e: ServerLost): void;
  sink: Sink | null;
  chunks: Buffer[];
  forwarded: boolean;
}

/** A server-side prepared statement of this connection. */
export interface ServerStatement {
  id: number;
  params: number;
}

/** A forwarded answer's chunks: none are kept (one shared empty list, not one per command). */
const NO_CHUNKS: Buffer[] = [];

/** COM_QUIT: the server ends the session and closes its end. */
const QUIT = Buffer.from([1, 0, 0, 0, 0x01]);
/** How long a closing connection's server gets to close its end before the socket is cut. */
const CLOSE_GRACE_MS = 1_000;

export class ServerConn {
  readonly threadId: number;
  /** The server is MariaDB, which refuses JSON-typed (0xF5) statement parameters. */
  readonly mariadb: boolean;
  /** The client capabilities (FOUND_ROWS, MULTI_STATEMENTS) this session was opened with. */
  readonly variant: number;
  collation: number;
  /** The collation the session was opened with (a reset goes back to it). */
  readonly initialCollation: number;
  /** A statement may have changed session state (USE, SET, ...): reset before another client gets it. */
  dirty = false;
  /** A KILL QUERY was sent at it: it may still land, so the connection is not handed out again. */
  doomed = false;
  /** Commands sent so far (tells a late timer whether the command it meant is still the one running). */
  commands = 0;
  /** Pool signature (target and role) the connection was opened for. */
  readonly signature: string;
  status: number;
  /** SQL text → this connection's prepared statement; bounded (oldest closed first). */
  readonly statements = new Map<string, ServerStatement>();
  idleSince = 0;
  /**
   * Called when the connection goes while a client keeps it between statements (pinned by session state, or
   * wirePoolMode 'session'); the keeping client sets it (each time, so it never piles up) and checks it is
   * still the holder.
   */
  onLostWhileKept: (() => void) | null = null;
  #socket: Socket;
  /** Commands go to the server through the handle (direct-writes.ts): one write each, no Writable bookkeeping. */
  readonly #writer: DirectWriter;
  readonly #scanner = new ResponseScanner();
  #job: Job | null = null;
  #gone = false;
  #onGone: Array<() => void> = [];
  /**
   * Resolves when the socket has closed: after COM_QUIT, once the server closed its end (its thread has
   * left the processlist), so the upstream pool's slot is freed only then (`destroy()`).
   */
  readonly ended: Promise<void>;

  constructor(login: LoggedIn, variant: number, collation: number, signature: string) {
    this.threadId = login.threadId;
    this.mariadb = /mariadb/i.test(login.serverVersion);
    this.variant = variant;
    this.collation = collation;
    this.initialCollation = collation;
    this.signature = signature;
    this.status = login.status || STATUS.AUTOCOMMIT;
    // The login reader let go of the socket: its reads are taken over here (direct-reads.ts).
    this.#socket = directReads(login.socket, (c) => this.#onData(c));
    this.#writer = new DirectWriter(this.#socket);
    this.#socket.on('error', () => this.destroy());
    const socket = this.#socket;
    this.ended = new Promise((resolve) =>
      socket.on('close', () => {
        this.destroy();
        resolve();
      }),
    );
  }

  get alive(): boolean {
    return !this.#gone;
  }

  get busy(): boolean {
    return this.#job !== null;
  }

  /** Outside any transaction, with autocommit on: safe to hand to another client. */
  get clean(): boolean {
    return (this.status & STATUS.IN_TRANS) === 0 && (this.status & STATUS.AUTOCOMMIT) !== 0;
  }

  onGone(f: () => void): void {
    if (this.#gone) f();
    else this.#onGone.push(f);
  }

  /**
   * Sends a command and follows its answer; forwarded to `sink` as it comes, or collected when sink is null.
   * `localFiles`: a LOCAL INFILE request pauses the answer (fileRequest) instead of ending it as an error.
   */
  run(cmd: Buffer, kind: ResponseKind, sink: Sink | null, localFiles = false): Promise<Answer> {
    if (this.#gone) return Promise.reject(new ServerLost(false));
    if (this.#job) return Promise.reject(new Error('server connection busy'));
    this.#scanner.start(kind, this.status, localFiles);
    this.commands++;
    return new Promise((resolve, reject) => {
      this.#job = { resolve, reject, sink, chunks: sink ? NO_CHUNKS : [], forwarded: false };
      this.#writer.write(cmd);
    });
  }

  /**
   * As run(), without a promise: the answer goes to `done`, or the loss to `lost`, called from the read that
   * ends it. The caller has checked the connection is alive and not busy, so neither is called before this
   * returns. The fast path of a statement on a held connection (session-link.ts start()).
   */
  start(cmd: Buffer, kind: ResponseKind, sink: Sink, localFiles: boolean, done: (a: Answer) => void, lost: (e: ServerLost) => void): void {
    this.#scanner.start(kind, this.status, localFiles);
    this.commands++;
    this.#job = { resolve: done, reject: lost, sink, chunks: NO_CHUNKS, forwarded: false };
    this.#writer.write(cmd);
  }

  /** Follows the rest of an answer that paused at a LOCAL INFILE request; call it before the file's last (empty) packet goes out. */
  follow(sink: Sink | null): Promise<Answer> {
    if (this.#gone) return Promise.reject(new ServerLost(true));
    this.#scanner.resume();
    return new Promise((resolve, reject) => {
      this.#job = { resolve, reject, sink, chunks: sink ? NO_CHUNKS : [], forwarded: true };
    });
  }

  /** A command that has no answer (COM_STMT_CLOSE, COM_STMT_SEND_LONG_DATA). */
  send(cmd: Buffer): void {
    if (!this.#gone) this.#writer.write(cmd);
  }

  #onData(chunk: Buffer): void {
    const job = this.#job;
    if (!job) {
      // Unasked-for bytes (a kill notice, a shutdown ERR): the session is over.
      this.destroy();
      return;
    }
    let end: number;
    try {
      end = this.#scanner.feed(chunk, 0);
    } catch {
      // A packet too short for its own type byte: the server is not speaking the protocol.
      this.destroy();
      return;
    }
    const part = end < 0 || end === chunk.length ? chunk : chunk.subarray(0, end);
    if (job.sink) {
      job.forwarded = true;
      if (!job.sink.write(part) && end < 0) {
        // Backpressure: stop reading the server until the client has taken what it got.
        this.#socket.pause();
        job.sink.onDrain(() => this.#socket.resume());
      }
    } else job.chunks.push(part);
    if (end < 0) return;
    this.#job = null;
    this.status = this.#scanner.status;
    const bytes = job.sink ? null : Buffer.concat(job.chunks);
    const answer: Answer = this.#scanner.fileRequest ? { error: false, status: this.status, bytes, fileRequest: true } : { error: this.#scanner.error, status: this.status, bytes };
    // Bytes past the answer: the two sides no longer agree where packets are. Destroyed before the answer is
    // handed on: a start() caller hears it at once and may start its next command here.
    if (end < chunk.length) this.destroy();
    job.resolve(answer);
  }

  destroy(): void {
    if (this.#gone) return;
    this.#gone = true;
    const socket = this.#socket;
    if (socket.writable) {
      // COM_QUIT, and the socket closes when the server has ended the session; cut if it does not soon.
      socket.end(QUIT);
      setTimeout(() => socket.destroy(), CLOSE_GRACE_MS).unref();
    } else socket.destroy();
    const job = this.#job;
    this.#job = null;
    job?.reject(new ServerLost(job.forwarded));
    for (const f of this.#onGone.splice(0)) f();
    const kept = this.onLostWhileKept;
    this.onLostWhileKept = null;
    kept?.();
  }
}
