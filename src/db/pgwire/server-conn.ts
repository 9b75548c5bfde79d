// One upstream server connection: logged in as the pool's managed role by node-postgres (TLS per sslmode,
// SCRAM/md5/cleartext), then its socket is taken over and spoken to frame by frame. The client linked to
// it (a transaction, or a whole session) receives every frame; an unlinked connection only waits.
import { isIP, type Socket } from 'node:net';
import pg from 'pg';
import type { DatabaseTarget } from '../../pool-request/snapshot.js';
import { guardedConnect, guardedSocket } from '../upstream-socket-guard.js';
import { directReads } from '../direct-reads.js';
import { DirectWriter } from '../direct-writes.js';
import { FrameReader } from './frames.js';
import { cancelRequest } from './messages.js';
import { READ_UNREPORTED, readParameterStatus, UNREPORTED } from './session-params.js';

/** Whoever is using the connection: a client's link, or the pool's reset. */
export interface ServerLink {
  /** One frame: bytes [start, end) of `buf` (a received chunk, kept unchanged; see frames.ts). */
  onServerFrame(type: number, buf: Buffer, start: number, end: number): void;
  onServerClosed(conn: ServerConn): void;
  /** The linked client can take more bytes again. */
  onServerDrain?(): void;
  /** Every frame of one received chunk was handed over: time to write them on. */
  onServerChunkEnd?(): void;
}

export interface ServerLogin {
  target: DatabaseTarget;
  username: string;
  password: string;
  tls: boolean;
  allowPrivate: boolean;
  connectTimeoutMs: number;
}

/** Server-to-client frames are trusted, but still bounded (PostgreSQL's own message limit is 1 GiB). */
const MAX_SERVER_FRAME = 1024 * 1024 * 1024;
const Z = 0x5a;
const PARAMETER_STATUS = 0x53;

let nextId = 1;

type PgInternals = pg.Client & {
  processID: number;
  secretKey: number;
  connection: NodeJS.EventEmitter & { stream: Socket };
};

/** ReadyForQuery's status byte as a letter, without making a string. */
function statusOf(byte: number): 'I' | 'T' | 'E' {
  return byte === 0x49 ? 'I' : byte === 0x54 ? 'T' : 'E';
}

/** Terminate: the server ends the session and closes its end. */
const TERMINATE = Buffer.from([0x58, 0, 0, 0, 4]);
/** How long a closing connection's server gets to close its end before the socket is cut. */
const CLOSE_GRACE_MS = 1_000;

export class ServerConn {
  /** Server connections open in this process (for leak checks). */
  static live = 0;
  readonly id = nextId++;
  /** The backend's process id and secret key, for CancelRequest. */
  readonly pid: number;
  readonly secret: number;
  readonly host: string;
  readonly port: number;
  /** The server's reported parameters: at login, then as ParameterStatus messages change them (SET, DISCARD ALL). */
  readonly params: Map<string, string>;
  /** The unreported tracked parameters as the connection opened with them: what a DISCARD ALL or RESET ALL returns them to. */
  readonly atLogin: ReadonlyMap<string, string>;
  /** Server-side names of the prepared statements this connection holds. */
  readonly prepared = new Set<string>();
  /** Transaction status from the last ReadyForQuery: I idle, T in a transaction, E failed transaction. */
  status: 'I' | 'T' | 'E' = 'I';
  /** The wanted-parameters map (a client's, never changed in place) these params were last found to match; null after a change. */
  settledFor: ReadonlyMap<string, string> | null = null;
  link: ServerLink | null = null;
  /** When it was last handed back idle (wireNow(): monotonic, and cheaper to read than Date.now() or performance.now()). */
  idleSince = 0;
  closed = false;
  /**
   * Resolves when the socket has closed: after a Terminate, once the server closed its end (its backend has
   * gone from pg_stat_activity), so the upstream pool's slot is freed only then (`close()`).
   */
  readonly ended: Promise<void>;
  /** Called once when the connection is gone (the pool forgets it). */
  onClose: ((conn: ServerConn) => void) | null = null;
  readonly #socket: Socket;
  readonly #writer: DirectWriter;
  readonly #reader = new FrameReader(MAX_SERVER_FRAME);
  readonly #sink = (type: number, buf: Buffer, start: number, end: number) => {
    if (type === Z) this.status = statusOf(buf[start + 5]!);
    else if (type === PARAMETER_STATUS) {
      const p = readParameterStatus(buf.subarray(start, end));
      if (p && this.params.get(p.name) !== p.value) {
        this.params.set(p.name, p.value);
        this.settledFor = null;
      }
    }
    if (this.link) this.link.onServerFrame(type, buf, start, end);
    // Unlinked: a notice or parameter change is dropped; a FATAL error is followed by the close.
  };

  readonly #allowPrivate: boolean;

  readonly #onChunk = (chunk: Buffer): void => {
    if (this.#reader.push(chunk, this.#sink)) return this.close();
    this.link?.onServerChunkEnd?.();
  };

  /** `loggedIn`: the socket node-postgres logged in on, with its listeners removed; its reads are taken over here. */
  private constructor(loggedIn: Socket, pid: number, secret: number, params: Map<string, string>, host: string, port: number, allowPrivate: boolean) {
    this.#allowPrivate = allowPrivate;
    const socket = directReads(loggedIn, this.#onChunk);
    this.#socket = socket;
    this.#writer = new DirectWriter(socket);
    socket.setNoDelay(true);
    this.pid = pid;
    this.secret = secret;
    this.params = params;
    const atLogin = new Map<string, string>();
    for (const name of UNREPORTED) atLogin.set(name, params.get(name)!);
    this.atLogin = atLogin;
    this.host = host;
    this.port = port;
    ServerConn.live++;
    socket.on('drain', () => this.link?.onServerDrain?.());
    socket.on('error', () => this.close());
    this.ended = new Promise((resolve) =>
      socket.on('close', () => {
        this.close();
        resolve();
      }),
    );
  }

  /** Logs in with node-postgres, then takes its socket: pg's parser and handlers are detached. */
  static async open(login: ServerLogin): Promise<ServerConn> {
    const t = login.target;
    const port = t.port ?? 5432;
    const client = new pg.Client({
      host: t.host,
      port,
      database: t.name,
      user: login.username,
      password: login.password,
      ssl: login.tls
        ? t.sslmode === 'verify-full'
          ? { rejectUnauthorized: true, ...(isIP(t.host) ? {} : { servername: t.host }) }
          : { rejectUnauthorized: false }
        : false,
      client_encoding: 'UTF8',
      application_name: 'poolgate',
      connectionTimeoutMillis: login.connectTimeoutMs,
      // Every connection re-checks the addresses it dials (DNS may have changed since the pool was created).
      stream: () => guardedSocket(login.allowPrivate),
    } as pg.ClientConfig) as PgInternals;
    const params = new Map<string, string>();
    client.connection.on('parameterStatus', (m: { parameterName: string; parameterValue: string }) => params.set(m.parameterName, m.parameterValue));
    client.on('error', () => {});
    await client.connect();
    // The tracked parameters the server does not report: known from here on by what poolgate sets.
    try {
      const row = (await client.query({ text: READ_UNREPORTED, rowMode: 'array' })).rows[0] as string[];
      UNREPORTED.forEach((name, i) => params.set(name, row[i]!));
    } catch (err) {
      await client.end().catch(() => {});
      throw err;
    }
    const conn = client.connection;
    const socket = conn.stream;
    // pg's own listeners must never see the stream again; its emitter keeps a sink for errors only.
    socket.removeAllListeners('data');
    socket.removeAllListeners('end');
    socket.removeAllListeners('error');
    socket.removeAllListeners('close');
    conn.removeAllListeners();
    conn.on('error', () => {});
    client.removeAllListeners();
    client.on('error', () => {});
    const server = new ServerConn(socket, client.processID, client.secretKey, params, t.host, port, login.allowPrivate);
    if (server.#socket.destroyed) server.close();
    return server;
  }

  write(bytes: Buffer): boolean {
    if (this.closed) return false;
    return this.#writer.write(bytes);
  }

  cork(): void {
    this.#socket.cork();
  }

  uncork(): void {
    this.#socket.uncork();
  }

  /** Reading is paused (the linked client is not keeping up): resume() is a no-op otherwise, on every unlink. */
  #paused = false;

  pause(): void {
    this.#paused = true;
    this.#socket.pause();
  }

  resume(): void {
    if (!this.#paused) return;
    this.#paused = false;
    this.#socket.resume();
  }

  get writable(): boolean {
    return !this.closed && !this.#writer.needDrain;
  }

  /** Asks the server to stop the statement this connection is running (a CancelRequest on a new connection). */
  cancel(): void {
    const s = guardedConnect(this.host, this.port, this.#allowPrivate);
    s.on('error', () => {});
    s.setTimeout(10_000, () => s.destroy());
    s.once('connect', () => s.end(cancelRequest(this.pid, this.secret)));
  }

  /** A RESET ALL or DISCARD ALL ran: the unreported parameters are back at their login values. */
  resetUnreported(): void {
    for (const [name, value] of this.atLogin) this.params.set(name, value);
    this.settledFor = null;
  }

  /** Closes the connection (PostgreSQL rolls back whatever transaction it had open). */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    ServerConn.live--;
    const socket = this.#socket;
    if (socket.writable) {
      // Terminate, and the socket closes when the server has ended the session; cut if it does not soon.
      socket.end(TERMINATE);
      setTimeout(() => socket.destroy(), CLOSE_GRACE_MS).unref();
    } else socket.destroy();
    const link = this.link;
    this.link = null;
    link?.onServerClosed(this);
    this.onClose?.(this);
  }
}
