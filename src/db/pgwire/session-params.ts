// Session parameters a client sets at login (startup packet, or `options=-c name=value`) and expects to keep
// on whichever server connection runs its transaction: the ones PgBouncer tracks too. Each server connection
// knows its current values (from the ParameterStatus messages the server reports); when a client is linked
// to a connection whose values differ from the client's, a SET for the differing ones goes ahead of the
// client's first message, and its answers are swallowed.
import { cstring } from './frames.js';
import { query } from './messages.js';

/**
 * Tracked parameters the server does not report (no ParameterStatus): their values on a server connection
 * are read once when it opens (ServerConn.open), and from then on known from what we set ourselves. A client's
 * own SET of one pins it to its server connection (pinning.ts), so no other change can go unseen.
 */
export const UNREPORTED: readonly string[] = ['statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout', 'search_path', 'extra_float_digits'];
const UNREPORTED_SET = new Set(UNREPORTED);

/** Whether the server reports this (tracked) parameter in ParameterStatus. */
export function reported(name: string): boolean {
  return !UNREPORTED_SET.has(name);
}

/** The tracked parameters, by lower-case name (GUC names are case-insensitive), in the server's spelling. */
const TRACKED = new Map(
  ['application_name', 'client_encoding', 'DateStyle', 'IntervalStyle', 'TimeZone', 'standard_conforming_strings', ...UNREPORTED].map((n) => [n.toLowerCase(), n]),
);

/** Startup parameters that are not session settings: read by the listener itself, or protocol options. */
export function notASetting(name: string): boolean {
  return name === 'user' || name === 'database' || name === 'options' || name === 'replication' || name.startsWith('_pq_.');
}

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
    // PostgreSQL's own default application_name is empty: the upstream login's 'poolgate' is not the client's.
    const v = fromClient.get(name) ?? (name === 'application_name' ? '' : defaults.get(name));
    if (v !== undefined) wanted.set(name, v);
  }
  return wanted;
}

/** An E'' literal: right whatever standard_conforming_strings the connection has. */
function literal(value: string): string {
  return `E'${value.replace(/\\/g, '\\\\').replace(/'/g, "''")}'`;
}

/**
 * The Query that makes a server connection's tracked parameters the client's, or null when they already are.
 * set_config takes the value as a startup packet or `-c` gives it (`SET search_path TO '"$user", public'`
 * would name one schema). The unreported ones are recorded in `current` now: no ParameterStatus will.
 */
export function setupQuery(wanted: ReadonlyMap<string, string>, current: Map<string, string>): Buffer | null {
  let sql = '';
  for (const [name, value] of wanted) {
    if (current.get(name) === value) continue;
    sql += `${sql === '' ? 'SELECT ' : ', '}pg_catalog.set_config('${name}', ${literal(value)}, false)`;
    if (!reported(name)) current.set(name, value);
  }
  return sql === '' ? null : query(sql);
}

/** After a setup that failed part way, what the unreported parameters are is not known: the next link sets them all. */
export function forgetUnreported(current: Map<string, string>): void {
  for (const name of UNREPORTED) current.set(name, '\0unknown');
}

/** A configuration parameter name as PostgreSQL accepts one (custom ones have a dot). */
export function settingName(name: string): boolean {
  return /^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?$/.test(name) && name.length <= 63;
}

/** set_config calls for settings given at login that poolgate does not track (the client is pinned for them). */
export function loginSettingsSql(settings: ReadonlyMap<string, string>): string {
  let sql = '';
  for (const [name, value] of settings) sql += `${sql === '' ? 'SELECT ' : ', '}pg_catalog.set_config(${literal(name)}, ${literal(value)}, false)`;
  return sql;
}

/** The SQL that reads the unreported parameters of a fresh connection, in UNREPORTED's order. */
export const READ_UNREPORTED = `SELECT ${UNREPORTED.map((n, i) => `pg_catalog.current_setting('${n}') AS v${i}`).join(', ')}`;
