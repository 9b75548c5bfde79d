// Pool creation inputs: https origin parsing, database host checks, derived names and subdomain labels.
import ipaddr from 'ipaddr.js';
import { randomBytes } from 'node:crypto';

export interface ParsedOrigin {
  /** Normalised `https://host[:port]` (default port dropped, host lower-cased, IDN as punycode). */
  origin: string;
  /** Lower-case `host[:port]`: the key a live pool is reused by. */
  host: string;
  /** Host name alone (IPv6 in brackets), for the target guard. */
  hostname: string;
}

export type Parsed<T> = { ok: true; value: T } | { ok: false; reason: string };

/** An https origin: scheme https, a host, an optional port, nothing else (no userinfo, path, query, fragment). */
export function parseOrigin(raw: string): Parsed<ParsedOrigin> {
  const text = raw.trim();
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return { ok: false, reason: 'origin is not a URL' };
  }
  if (url.protocol !== 'https:') return { ok: false, reason: 'origin must use https' };
  if (url.username || url.password || /^https:\/\/[^/]*@/i.test(text)) return { ok: false, reason: 'origin must not carry credentials' };
  // The URL parser forgives an empty query or fragment ("?" / "#"); the raw text must not carry them at all.
  if (url.search || url.hash || text.includes('?') || text.includes('#')) return { ok: false, reason: 'origin must not have a query or fragment' };
  if (url.pathname !== '/') return { ok: false, reason: 'origin must not have a path' };
  if (!url.hostname) return { ok: false, reason: 'origin has no host' };
  return { ok: true, value: { origin: url.origin, host: url.host.toLowerCase(), hostname: url.hostname.toLowerCase() } };
}

const HOSTNAME = /^(?=.{1,253}\.?$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*\.?$/i;

/** A database host: a DNS name or an IP literal (the target guard then decides whether it is public). */
export function parseDbHost(raw: string): Parsed<string> {
  const host = raw.trim().toLowerCase().replace(/\.$/, '');
  const bare = host.startsWith('[') && host.endsWith(']') ? host.slice(1, -1) : host;
  if (HOSTNAME.test(host)) return { ok: true, value: host };
  if (ipaddr.IPv6.isValid(bare)) return { ok: true, value: bare };
  return { ok: false, reason: 'db_host must be a host name or an IP address (no scheme, port or path)' };
}

export const NAME_MAX = 100;

/** A user-given pool or credential name: trimmed, non-empty, no control characters. */
export function cleanName(raw: string): Parsed<string> {
  const name = raw.trim();
  if (!name) return { ok: false, reason: 'name must not be blank' };
  if (/[\u0000-\u001f\u007f]/.test(name)) return { ok: false, reason: 'name must not contain control characters' };
  return { ok: true, value: name };
}

/**
 * Labels that would be confusing or collide with the service's own hosts and routes
 * (`/api/v1/pools/database` is a route, so `database` never names a pool).
 */
const RESERVED_LABELS = new Set(['www', 'api', 'app', 'lock', 'mcp', 'admin', 'dashboard', 'metrics', 'database', 'status', 'docs']);

export const SUBDOMAIN_MAX = 40;

/** The base DNS label for a name: accents dropped, lowercase a-z0-9 and '-', no leading/trailing '-', at most 40 characters. */
export function subdomainBase(name: string): string {
  const label = name
    .toLowerCase()
    .normalize('NFKD')
    .replace(/[\u0300-\u036f]/g, '') // accents dropped, not turned into '-'
    .replace(/[^a-z0-9]+/g, '-')
    .replace(/^-+|-+$/g, '')
    .slice(0, SUBDOMAIN_MAX)
    .replace(/-+$/g, '');
  return label || 'pool';
}

const SUFFIX_ALPHABET = 'abcdefghijklmnopqrstuvwxyz0123456789';

function randomSuffix(length = 6): string {
  return [...randomBytes(length)].map((b) => SUFFIX_ALPHABET[b % SUFFIX_ALPHABET.length]).join('');
}

/**
 * Candidate subdomains in the order to try them: the base itself (unless reserved), then the base
 * shortened to leave room for `-` and a random 6-character suffix, so every candidate stays ≤ 40 characters.
 */
export function subdomainCandidates(name: string, count = 6): string[] {
  const base = subdomainBase(name);
  const out: string[] = RESERVED_LABELS.has(base) ? [] : [base];
  const stem = base.slice(0, SUBDOMAIN_MAX - 7).replace(/-+$/g, '') || 'pool';
  while (out.length < count) out.push(`${stem}-${randomSuffix()}`);
  return out;
}

/** The pattern a pool path segment must match; anything else cannot name a pool (404). */
export const SUBDOMAIN_PATTERN = '^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$';
