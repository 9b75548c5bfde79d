// Opens one upstream MySQL/MariaDB connection as the pool's managed role: TCP through the SSRF guard,
// TLS per db_sslmode (plaintext only with dbAllowInsecure when the server offers none), then the auth
// exchange (mysql_native_password, caching_sha2_password fast and full auth over TLS, clear text over TLS).
import { ALLOW_INSECURE_HINT } from '../../config/hints.js';
import { isIP, type Socket } from 'node:net';
import { connect as tlsConnect, type TLSSocket } from 'node:tls';
import { guardedConnect } from '../upstream-socket-guard.js';
import { BASE_CAPABILITIES, CLIENT, MARIADB, VARIANT_CAPABILITIES, VARIANT_MARIADB_METADATA, frame, okStatus, readNulString } from './packets.js';
import { FrameReader, type Packet } from './frame-reader.js';
import { nativeScramble, sha2Scramble } from './scramble.js';

export interface LoginTarget {
  host: string;
  port: number;
  database: string;
  user: string;
  password: string;
  sslmode: 'verify-full' | 'require';
  allowInsecure: boolean;
  allowPrivate: boolean;
  /** Capabilities the client chose among VARIANT_CAPABILITIES, and VARIANT_MARIADB_METADATA. */
  variant: number;
  /** Collation id for the session (the client's). */
  collation: number;
  timeoutMs: number;
}

export interface LoggedIn {
  socket: Socket | TLSSocket;
  threadId: number;
  serverVersion: string;
  /** The server's greeting capabilities, and its MariaDB extended ones (0 from MySQL). */
  serverCapabilities: number;
  mariadbCapabilities: number;
  status: number;
}

/** A failure to open the upstream session: `errno`/`message` are the server's when it answered with ERR. */
export class UpstreamLoginError extends Error {
  constructor(
    message: string,
    readonly errno: number | null = null,
  ) {
    super(message);
  }
}

/** Reads packets off a socket one at a time during the login exchange. */
class LoginReader {
  readonly #frames = new FrameReader(1 << 20);
  #wait: ((p: Packet | Error) => void) | null = null;
  #failed: Error | null = null;
  readonly #onData = (c: Buffer) => {
    this.#frames.push(c);
    this.#pump();
  };
  readonly #onEnd = (err?: Error) => {
    this.#failed ??= err ?? new UpstreamLoginError('the database closed the connection during login');
    this.#pump();
  };

  constructor(readonly socket: Socket) {
    socket.on('data', this.#onData);
    socket.on('error', this.#onEnd);
    socket.on('close', () => this.#onEnd());
  }

  #pump(): void {
    if (!this.#wait) return;
    const p = this.#frames.next();
    if (p) {
      const w = this.#wait;
      this.#wait = null;
      w(p);
    } else if (this.#failed || this.#frames.oversized) {
      const w = this.#wait;
      this.#wait = null;
      w(this.#failed ?? new UpstreamLoginError('oversized packet from the database during login'));
    }
  }

  next(): Promise<Packet> {
    return new Promise((resolve, reject) => {
      this.#wait = (p) => (p instanceof Error ? reject(p) : resolve(p));
      this.#pump();
    });
  }

  detach(): void {
    this.socket.off('data', this.#onData);
    this.socket.off('error', this.#onEnd);
    this.socket.removeAllListeners('close');
  }

  get buffered(): number {
    return this.#frames.buffered;
  }
}

function serverError(payload: Buffer): UpstreamLoginError {
  const errno = payload.length >= 3 ? payload.readUInt16LE(1) : 0;
  const msg = payload.length > 9 && payload[3] === 0x23 ? payload.toString('utf8', 9) : payload.toString('utf8', 3);
  return new UpstreamLoginError(`the database refused the login (${errno}): ${msg}`, errno);
}

function authToken(plugin: string, password: string, nonce: Buffer, tls: boolean): Buffer {
  if (plugin === 'mysql_native_password') return nativeScramble(password, nonce);
  if (plugin === 'caching_sha2_password') return sha2Scramble(password, nonce);
  if (plugin === 'mysql_clear_password' && tls) return Buffer.from(password + '\0', 'utf8');
  throw new UpstreamLoginError(`the database asks for auth plugin ${plugin}, which poolgate does not speak${plugin === 'mysql_clear_password' ? ' without TLS' : ''}`);
}

export async function upstreamLogin(t: LoginTarget): Promise<LoggedIn> {
  let socket: Socket = guardedConnect(t.host, t.port, t.allowPrivate);
  socket.setNoDelay(true);
  const timer = setTimeout(() => socket.destroy(new UpstreamLoginError('timed out connecting to the database')), t.timeoutMs);
  let reader = new LoginReader(socket);
  try {
    const hello = await reader.next();
    const p = hello.payload;
    if (p[0] === 0xff) throw serverError(p);
    if (p[0] !== 10) throw new UpstreamLoginError('the database speaks an unknown protocol version');
    const v = readNulString(p, 1);
    if (!v) throw new UpstreamLoginError('malformed handshake from the database');
    let o = v[1];
    const threadId = p.readUInt32LE(o);
    o += 4;
    const nonce1 = p.subarray(o, o + 8);
    o += 9;
    let caps = p.readUInt16LE(o);
    o += 2 + 1 + 2; // charset, status
    caps |= p.readUInt16LE(o) << 16;
    o += 2;
    const authLen = p[o]!;
    const mariadbCaps = (caps & CLIENT.LONG_PASSWORD) === 0 && o + 11 <= p.length ? p.readUInt32LE(o + 7) : 0;
    o += 11;
    const n2 = Math.max(13, authLen - 8);
    const nonce2 = p.subarray(o, o + n2 - 1); // without its trailing NUL
    o += n2;
    const plugin0 = readNulString(p, o)?.[0] || 'mysql_native_password';
    let nonce = Buffer.concat([nonce1, nonce2]);

    let seq = hello.seq + 1;
    let tls = false;
    let myCaps = BASE_CAPABILITIES | (t.variant & VARIANT_CAPABILITIES);
    if ((myCaps & CLIENT.SESSION_TRACK & ~caps) !== 0) {
      throw new UpstreamLoginError(`the database (${v[0]}) does not offer session tracking, which this client was offered in poolgate's greeting (pools on servers of different kinds: see the mysqlServerVersion setting); connect again`);
    }
    // The client negotiated MariaDB's extended column metadata with poolgate: its answers must carry it.
    let myMariadbCaps = 0;
    if ((t.variant & VARIANT_MARIADB_METADATA) !== 0) {
      if ((mariadbCaps & MARIADB.EXTENDED_METADATA) === 0) {
        throw new UpstreamLoginError(`the database (${v[0]}) does not offer MariaDB extended column metadata, which this client was offered in poolgate's greeting (pools on servers of different engines: see the mysqlServerVersion setting); connect again`);
      }
      myCaps &= ~CLIENT.LONG_PASSWORD;
      myMariadbCaps = MARIADB.EXTENDED_METADATA;
    }
    // Bulk operations change nothing until a client sends COM_STMT_BULK_EXECUTE: asked for whenever offered.
    if ((mariadbCaps & MARIADB.STMT_BULK_OPERATIONS) !== 0) {
      myCaps &= ~CLIENT.LONG_PASSWORD;
      myMariadbCaps |= MARIADB.STMT_BULK_OPERATIONS;
    }
    if ((caps & CLIENT.SSL) !== 0) {
      myCaps |= CLIENT.SSL;
      // SSLRequest: the first 32 bytes of the handshake response, then TLS on the same socket.
      const req = Buffer.alloc(32);
      req.writeUInt32LE(myCaps >>> 0, 0);
      req.writeUInt32LE(1 << 24, 4);
      req[8] = t.collation;
      req.writeUInt32LE(myMariadbCaps, 28);
      socket.write(frame(seq++, req));
      reader.detach();
      const secure = tlsConnect({
        socket,
        rejectUnauthorized: t.sslmode === 'verify-full',
        ...(isIP(t.host) ? {} : { servername: t.host }),
      });
      await new Promise<void>((resolve, reject) => {
        secure.once('secureConnect', () => resolve());
        secure.once('error', reject);
      });
      socket = secure;
      reader = new LoginReader(socket);
      tls = true;
    } else if (!t.allowInsecure) {
      throw new UpstreamLoginError(`the database does not offer TLS (${ALLOW_INSECURE_HINT})`);
    }

    const user = Buffer.from(t.user + '\0', 'utf8');
    const db = Buffer.from(t.database + '\0', 'utf8');
    let plugin = plugin0;
    const token = authToken(plugin, t.password, nonce, tls);
    const head = Buffer.alloc(32);
    head.writeUInt32LE(myCaps >>> 0, 0);
    head.writeUInt32LE(1 << 24, 4);
    head[8] = t.collation;
    head.writeUInt32LE(myMariadbCaps, 28);
    socket.write(frame(seq++, Buffer.concat([head, user, Buffer.from([token.length]), token, db, Buffer.from(plugin + '\0', 'latin1')])));

    for (;;) {
      const r = await reader.next();
      seq = r.seq + 1;
      const q = r.payload;
      if (q[0] === 0x00) {
        reader.detach();
        if (reader.buffered > 0) throw new UpstreamLoginError('the database sent data after the login');
        const status = okStatus(q) ?? 0;
        return { socket, threadId, serverVersion: v[0], serverCapabilities: caps >>> 0, mariadbCapabilities: mariadbCaps, status };
      }
      if (q[0] === 0xff) throw serverError(q);
      if (q[0] === 0xfe) {
        // AuthSwitchRequest: a plugin name and a fresh nonce.
        const name = readNulString(q, 1);
        if (!name) throw new UpstreamLoginError('malformed auth switch from the database');
        plugin = name[0];
        let data = q.subarray(name[1]);
        if (data.length > 0 && data[data.length - 1] === 0) data = data.subarray(0, data.length - 1);
        nonce = Buffer.from(data);
        socket.write(frame(seq, authToken(plugin, t.password, nonce, tls)));
        continue;
      }
      if (q[0] === 0x01 && plugin === 'caching_sha2_password') {
        if (q[1] === 0x03) continue; // fast auth succeeded: the OK follows
        if (q[1] === 0x04) {
          // Full authentication: the password itself, only ever over TLS.
          if (!tls) throw new UpstreamLoginError('the database wants caching_sha2_password full authentication, which poolgate sends only over TLS');
          socket.write(frame(seq, Buffer.from(t.password + '\0', 'utf8')));
          continue;
        }
      }
      throw new UpstreamLoginError('unexpected packet from the database during login');
    }
  } catch (err) {
    reader.detach();
    socket.destroy();
    throw err instanceof UpstreamLoginError ? err : new UpstreamLoginError(`cannot reach the database: ${(err as Error).message}`);
  } finally {
    clearTimeout(timer);
  }
}
