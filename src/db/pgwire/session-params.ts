// Session parameters a client sets at login (startup packet, or `options=-c name=value`) and expects to keep
// on whichever server connection runs its transaction: the ones PgBouncer tracks too. Each server connection
// knows its current values (from the ParameterStatus messages the server reports); when a client is linked
// to a connection whose values differ from the client's, a SET for the differing ones goes ahead of the
// client's first message, and its answers are swallowed.
import { cstring } from './frames.js';
import { query } from './messages.js';

/** The tracked parameters, by lower-case name (GUC names are case-insensitive), in the server's spelling. */
const TRACKED = new Map(
  ['application_name', 'client_encoding', 'DateStyle', 'IntervalStyle', 'TimeZone', 'standard_conforming_strings'].map((n) => [n.toLowerCase(), n]),
);

/** The tracked parameters, for messages. */
export const TRACKED_LIST = [...TRACKED.values()].join(', ');

/** The server's spelling of a tracked parameter name, or null when it is not tracked. */
export function trackedName(name: string): string | null {
  return TRACKED.get(name.toLowerCase()) ?? null;
}

/** Name and value of a ParameterStatus frame ('S'), or null when malformed. */
export function readParameterStatus(frame: Buffer): { name: string; value: string } | null {
  const name = cstring(frame, 5);
  const value = name && cstring(frame, name.next);
  return name && value ? { name: name.value, value: value.value } : null;
}

/**
 * What a client wants on every server connection it uses: for each tracked parameter the server reports,
 * the client's own value if it gave one at login, else the pool's default (the value of a fresh connection).
 */
export function wantedParams(defaults: ReadonlyMap<string, string>, fromClient: ReadonlyMap<string, string>): Map<string, string> {
  const wanted = new Map<string, string>();
  for (const name of TRACKED.values()) {
    const v = fromClient.get(name) ?? defaults.get(name);
    if (v !== undefined) wanted.set(name, v);
  }
  return wanted;
}

/** An E'' literal: right whatever standard_conforming_strings the connection has. */
function literal(value: string): string {
  return `E'${value.replace(/\\/g, '\\\\').replace(/'/g, "''")}'`;
}

/** The Query that makes a server connection's tracked parameters the client's, or null when they already are. */
export function setupQuery(wanted: ReadonlyMap<string, string>, current: ReadonlyMap<string, string>): Buffer | null {
  let sql = '';
  for (const [name, value] of wanted) {
    if (current.get(name) === value) continue;
    sql += `SET ${name} TO ${literal(value)};`;
  }
  return sql === '' ? null : query(sql);
}
