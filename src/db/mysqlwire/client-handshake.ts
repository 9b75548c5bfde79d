// Parses a client's HandshakeResponse41 (or its 32-byte SSLRequest prefix), bounds-checked: a malformed
// one is null, never an exception.
import { CLIENT, readLenenc, readNulString } from './packets.js';

export interface HandshakeResponse {
  capabilities: number;
  /** MariaDB extended capabilities (packets.ts MARIADB); 0 when the client set CLIENT_MYSQL. */
  mariadbCapabilities: number;
  collation: number;
  /** Only the SSLRequest prefix: TLS comes next, then the full response. */
  sslRequest: boolean;
  user: string;
  auth: Buffer;
  database: string | null;
  plugin: string | null;
}

export function parseHandshakeResponse(p: Buffer): HandshakeResponse | null {
  if (p.length < 32) return null;
  const capabilities = p.readUInt32LE(0);
  if ((capabilities & CLIENT.PROTOCOL_41) === 0) return null;
  const collation = p[8]!;
  const mariadbCapabilities = (capabilities & CLIENT.LONG_PASSWORD) === 0 ? p.readUInt32LE(28) : 0;
  if (p.length === 32) {
    if ((capabilities & CLIENT.SSL) === 0) return null;
    return { capabilities, mariadbCapabilities, collation, sslRequest: true, user: '', auth: Buffer.alloc(0), database: null, plugin: null };
  }
  const u = readNulString(p, 32);
  if (!u) return null;
  let o = u[1];
  let auth: Buffer;
  if ((capabilities & CLIENT.PLUGIN_AUTH_LENENC) !== 0) {
    const l = readLenenc(p, o);
    if (!l || o + l[1] + l[0] > p.length) return null;
    auth = p.subarray(o + l[1], o + l[1] + l[0]);
    o += l[1] + l[0];
  } else if ((capabilities & CLIENT.SECURE_CONNECTION) !== 0) {
    if (o >= p.length) return null;
    const n = p[o]!;
    if (o + 1 + n > p.length) return null;
    auth = p.subarray(o + 1, o + 1 + n);
    o += 1 + n;
  } else {
    const s = p.indexOf(0, o);
    if (s < 0) return null;
    auth = p.subarray(o, s);
    o = s + 1;
  }
  let database: string | null = null;
  if ((capabilities & CLIENT.CONNECT_WITH_DB) !== 0 && o < p.length) {
    const d = readNulString(p, o);
    if (!d) return null;
    database = d[0];
    o = d[1];
  }
  let plugin: string | null = null;
  if ((capabilities & CLIENT.PLUGIN_AUTH) !== 0 && o < p.length) {
    const n = readNulString(p, o);
    // Some clients omit the final NUL.
    plugin = n ? n[0] : p.toString('latin1', o);
  }
  return { capabilities, mariadbCapabilities, collation, sslRequest: false, user: u[0], auth: Buffer.from(auth), database, plugin };
}
