// The client's first packets: which request it is (startup, SSLRequest, GSSENCRequest, CancelRequest), the
// startup parameters, and the pool they name (SNI `<subdomain>.{pool_domain}`, else `options=pool=<sub>`, else
// a `user` that is a pool's subdomain).
import { settingName, trackedName } from './session-params.js';

export const PROTOCOL_3 = 196608;
export const SSL_REQUEST = 80877103;
export const GSSENC_REQUEST = 80877104;
export const CANCEL_REQUEST = 80877102;
/** Longest startup packet accepted (PostgreSQL's own limit is 10000 bytes). */
export const MAX_STARTUP_BYTES = 10_000;

export type FirstPacket =
  | { kind: 'ssl' }
  | { kind: 'gssenc' }
  | { kind: 'cancel'; pid: number; secret: number }
  | { kind: 'startup'; minor: number; params: Map<string, string> }
  | { kind: 'bad'; message: string };

/** Reads one untyped packet (length included). */
export function readFirstPacket(p: Buffer): FirstPacket {
  if (p.length < 8) return { kind: 'bad', message: 'startup packet too short' };
  const code = p.readInt32BE(4);
  if (code === SSL_REQUEST) return p.length === 8 ? { kind: 'ssl' } : { kind: 'bad', message: 'malformed SSLRequest' };
  if (code === GSSENC_REQUEST) return p.length === 8 ? { kind: 'gssenc' } : { kind: 'bad', message: 'malformed GSSENCRequest' };
  if (code === CANCEL_REQUEST) {
    if (p.length !== 16) return { kind: 'bad', message: 'malformed CancelRequest' };
    return { kind: 'cancel', pid: p.readInt32BE(8), secret: p.readInt32BE(12) };
  }
  const major = code >>> 16;
  if (major !== 3) return { kind: 'bad', message: `unsupported frontend protocol ${major}.${code & 0xffff}: only 3.0 is served` };
  // name\0value\0 ... \0
  const params = new Map<string, string>();
  let at = 8;
  for (;;) {
    if (at >= p.length) return { kind: 'bad', message: 'startup packet is not terminated' };
    if (p[at] === 0) break;
    const nameEnd = p.indexOf(0, at);
    if (nameEnd < 0) return { kind: 'bad', message: 'startup packet is not terminated' };
    const valueEnd = p.indexOf(0, nameEnd + 1);
    if (valueEnd < 0) return { kind: 'bad', message: 'startup packet is not terminated' };
    params.set(p.toString('utf8', at, nameEnd), p.toString('utf8', nameEnd + 1, valueEnd));
    at = valueEnd + 1;
  }
  if (at !== p.length - 1) return { kind: 'bad', message: 'trailing bytes after the startup parameters' };
  return { kind: 'startup', minor: code & 0xffff, params };
}

/** Splits a libpq `options` string on unescaped white space (a backslash escapes the next character). */
function optionWords(options: string): string[] {
  const words: string[] = [];
  let cur = '';
  let inWord = false;
  for (let i = 0; i < options.length; i++) {
    const ch = options[i]!;
    if (ch === '\\' && i + 1 < options.length) {
      cur += options[++i];
      inWord = true;
    } else if (/\s/.test(ch)) {
      if (inWord) words.push(cur);
      cur = '';
      inWord = false;
    } else {
      cur += ch;
      inWord = true;
    }
  }
  if (inWord) words.push(cur);
  return words;
}

/**
 * What `options` says: the pool (`pool=<sub>`, `-c pool=<sub>`, `-cpool=<sub>` or `--pool=<sub>`) and
 * settings of the session parameters poolgate keeps per client (`-c TimeZone=UTC`, see session-params.ts).
 * Anything else is refused: it would be silently lost on pooled server connections.
 */
export function readOptions(options: string | undefined): { pool: string | null; settings: Map<string, string>; others: Map<string, string> } | { error: string } {
  const settings = new Map<string, string>();
  const others = new Map<string, string>();
  if (!options) return { pool: null, settings, others };
  const words = optionWords(options);
  let pool: string | null = null;
  for (let i = 0; i < words.length; i++) {
    let w = words[i]!;
    if (w === '-c' && i + 1 < words.length) w = words[++i]!;
    else if (w.startsWith('-c')) w = w.slice(2);
    else if (w.startsWith('--')) w = w.slice(2);
    const eq = w.indexOf('=');
    const name = eq > 0 ? w.slice(0, eq) : '';
    if (name === 'pool') {
      pool = w.slice(eq + 1);
      continue;
    }
    const tracked = name ? trackedName(name.replace(/-/g, '_')) : null;
    if (tracked) {
      settings.set(tracked, w.slice(eq + 1));
      continue;
    }
    // Any other setting is applied too, and pins the client to its server connection (client-conn.ts).
    if (name && settingName(name.replace(/-/g, '_'))) {
      others.set(name.replace(/-/g, '_'), w.slice(eq + 1));
      continue;
    }
    return {
      error: `the options parameter may only name the pool (options=pool=<subdomain>) and set parameters (-c name=value); ${JSON.stringify(words[i])} is not accepted`,
    };
  }
  return { pool, settings, others };
}

/** The pool subdomain an SNI server name points to, or null when it is not `<subdomain>.{poolDomain}`. */
export function poolFromServerName(servername: string | null | undefined, poolDomain: string): string | null {
  if (!servername) return null;
  const name = servername.toLowerCase();
  const suffix = `.${poolDomain.toLowerCase()}`;
  if (!name.endsWith(suffix)) return null;
  const sub = name.slice(0, -suffix.length);
  return sub.length > 0 && !sub.includes('.') ? sub : null;
}

/**
 * The pool a startup `user` names: a pool's subdomain (any case), as on the MySQL listener. Consulted only
 * when neither SNI nor `options` names a pool; null when it is no pool's subdomain.
 */
export function poolFromUser(user: string | undefined, pools: ReadonlyMap<string, unknown>): string | null {
  if (!user) return null;
  const sub = user.toLowerCase();
  return pools.has(sub) ? sub : null;
}
