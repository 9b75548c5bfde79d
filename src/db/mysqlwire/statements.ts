// Prepared statements across server connections: a client's statement ids are poolgate's own (the SQL
// and the parameter types it last sent); each server connection keeps its own statement per SQL text,
// prepared on first use there. Execute packets are rewritten to the server's id (and given the types).
import { COM, frame, splitPackets } from './packets.js';
import type { ServerConn, ServerStatement } from './server-conn.js';

const TYPE_JSON = 0xf5;
const TYPE_VAR_STRING = 0xfd;

/** Server statements kept per connection; the oldest is closed beyond this. */
const PER_CONNECTION = 256;
/** COM_STMT_SEND_LONG_DATA bytes held per statement until its execute. */
export const LONG_DATA_LIMIT = 16 << 20;

export class ClientStatement {
  /** The COM_STMT_PREPARE payload (command byte and SQL), replayed on a connection that lacks it. */
  readonly prepare: Buffer;
  readonly key: string;
  readonly params: number;
  /** What executing it does to the session (session-state.ts bits; MariaDB prepares USE and SET too). */
  readonly effects: number;
  /** Parameter types (2 bytes each) the client last bound. */
  types: Buffer | null = null;
  /** COM_STMT_SEND_LONG_DATA payloads since the last execute. */
  longData: Buffer[] = [];
  longBytes = 0;

  constructor(prepare: Buffer, params: number, effects: number) {
    this.prepare = prepare;
    this.key = prepare.toString('latin1', 1);
    this.params = params;
    this.effects = effects;
  }

  /**
   * The COM_STMT_EXECUTE to send for server statement `serverId`, framed (sequence 0): new id, and the last types
   * when the client sent none. Framing is the one copy made of the client's payload (which is left as it came).
   * `jsonAsString`: JSON-typed parameters (0xF5) go as VAR_STRING. poolgate announces a MySQL version, so mysql2
   * sends arrays and objects as JSON, which MariaDB refuses (1210); both carry a length-encoded string, and
   * mysql2 sends MariaDB itself the same string as VAR_STRING.
   */
  executeFor(payload: Buffer, serverId: number, jsonAsString = false): Buffer | null {
    let body = payload;
    const bound = 10 + ((this.params + 7) >> 3);
    if (this.params > 0) {
      if (payload.length <= bound) return null;
      if (payload[bound] === 1) {
        if (payload.length < bound + 1 + 2 * this.params) return null;
        this.types = Buffer.from(payload.subarray(bound + 1, bound + 1 + 2 * this.params));
      } else if (this.types) {
        // The client bound types on another connection's statement: this one needs them too.
        body = Buffer.concat([payload.subarray(0, bound), Buffer.from([1]), this.types, payload.subarray(bound + 1)]);
      }
    }
    // The payload starts after the 4-byte header (a packet split at 16 MiB keeps its head, and these offsets, in the first piece).
    const out = frame(0, body);
    out.writeUInt32LE(serverId, 4 + 1);
    if (jsonAsString && this.params > 0 && out[4 + bound] === 1) {
      for (let i = 4 + bound + 1; i < 4 + bound + 1 + 2 * this.params; i += 2) if (out[i] === TYPE_JSON) out[i] = TYPE_VAR_STRING;
    }
    return out;
  }
}

/** The first packet of a prepare answer: server id, columns, params; null when it is an ERR or cut. */
export function prepareOk(bytes: Buffer): { id: number; columns: number; params: number } | null {
  const first = splitPackets(bytes)[0];
  if (!first || first.payload[0] !== 0x00 || first.payload.length < 9) return null;
  const p = first.payload;
  return { id: p.readUInt32LE(1), columns: p.readUInt16LE(5), params: p.readUInt16LE(7) };
}

/** Records a statement prepared on `conn`, closing the one it replaces or the oldest beyond the bound. */
export function remember(conn: ServerConn, key: string, st: ServerStatement): void {
  const old = conn.statements.get(key);
  if (old) {
    conn.statements.delete(key);
    conn.send(closePacket(old.id));
  } else if (conn.statements.size >= PER_CONNECTION) {
    const [k, v] = conn.statements.entries().next().value as [string, ServerStatement];
    conn.statements.delete(k);
    conn.send(closePacket(v.id));
  }
  conn.statements.set(key, st);
}

export function closePacket(id: number): Buffer {
  const p = Buffer.alloc(5);
  p[0] = COM.STMT_CLOSE;
  p.writeUInt32LE(id, 1);
  return frame(0, p);
}

/** A long-data payload re-addressed to server statement `serverId`. */
export function longDataFor(payload: Buffer, serverId: number): Buffer {
  const p = Buffer.from(payload);
  p.writeUInt32LE(serverId, 1);
  return frame(0, p);
}
