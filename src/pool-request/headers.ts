// Header rules of the proxy: hop-by-hop headers dropped both ways, pool auth kept from the origin,
// X-Forwarded-* set, the managed origin credential injected.
import type { CredentialSecret } from '../store/credentials.js';

/** RFC 9110 §7.6.1 connection-specific headers, plus `expect` (undici cannot send 100-continue). */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'expect',
]);

/** What `Connection: close` lists (never modified: callers only ask has()). */
const CLOSE_LISTED: ReadonlySet<string> = new Set(['close']);

/** Header names listed in a Connection header value: they are hop-by-hop too. */
export function connectionListed(value: string | undefined): ReadonlySet<string> | null {
  if (!value) return null;
  // What nearly every request and answer says (most origins send Connection: keep-alive), without a split, a Set and
  // lower-casing per request: `keep-alive` is hop-by-hop already; `close` lists only itself (one shared, read-only set).
  if (value === 'keep-alive' || value === 'Keep-Alive') return null;
  if (value === 'close' || value === 'Close') return CLOSE_LISTED;
  const names = new Set<string>();
  for (const part of value.split(',')) {
    const name = part.trim().toLowerCase();
    if (name) names.add(name);
  }
  return names.size > 0 ? names : null;
}

export function isHopByHop(name: string, listed: ReadonlySet<string> | null): boolean {
  return HOP_BY_HOP.has(name) || name.startsWith('proxy-') || (listed !== null && listed.has(name));
}

export interface UpstreamHeaderInput {
  /** The client's headers, names lower-case, repeated headers already joined. */
  headers: Record<string, string>;
  /** host[:port] of the origin: the Host the origin expects. */
  originHost: string;
  clientAddress: string;
  /**
   * The socket's peer is a trusted proxy (config trustedProxies): its X-Forwarded-* are kept (the peer is
   * appended to X-Forwarded-For). From any other peer they are replaced with what poolgate saw, so a
   * client cannot forge the chain the origin reads.
   */
  trustForwarded: boolean;
  /** The Host header the client sent (the pool hostname). */
  clientHost: string;
  /** The pool key travelled in Authorization: that header is pool auth, not the origin's. */
  keyInAuthorization: boolean;
  credential: CredentialSecret | null;
}

/**
 * The headers sent to the origin, as undici takes them flat (name, value, name, value…): no object is built per
 * request (a record filled with names known only at run time goes through V8's slow property-adding path; callgrind
 * counted it among the larger per-request costs over the Node floor).
 */
export function upstreamRequestHeaders(input: UpstreamHeaderInput): string[] {
  const { headers } = input;
  const listed = connectionListed(headers.connection);
  // An injected credential replaces any header of the same name: the client's and poolgate's own forwarding ones.
  const injected = injectedHeader(input.credential);
  const skip = injected === null ? null : injected[0];
  const out: string[] = [];
  for (const name in headers) {
    if (isHopByHop(name, listed)) continue;
    // Pool auth and our own control headers never reach the origin.
    if (name.startsWith('x-service-')) continue;
    if (name === 'host' || name.startsWith('x-forwarded-')) continue;
    if (name === 'authorization' && input.keyInAuthorization) continue;
    if (name === skip) continue;
    out.push(name, headers[name]!);
  }
  out.push('host', input.originHost);
  const trusted = input.trustForwarded;
  const prior = trusted ? headers['x-forwarded-for'] : undefined;
  if (skip !== 'x-forwarded-for') out.push('x-forwarded-for', prior ? `${prior}, ${input.clientAddress}` : input.clientAddress);
  if (skip !== 'x-forwarded-proto') out.push('x-forwarded-proto', (trusted && headers['x-forwarded-proto']) || 'http');
  if (skip !== 'x-forwarded-host') out.push('x-forwarded-host', (trusted && headers['x-forwarded-host']) || input.clientHost);
  if (injected !== null) out.push(injected[0], injected[1]);
  return out;
}

/** The header a managed credential puts on a request to an http origin (name lower-cased), or none. */
function injectedHeader(cred: CredentialSecret | null): [string, string] | null {
  switch (cred?.method) {
    case 'bearer_static':
      return ['authorization', `Bearer ${cred.token}`];
    case 'api_key':
      return [(cred.header_name || 'x-api-key').toLowerCase(), cred.api_key];
    case 'basic':
      return ['authorization', `Basic ${Buffer.from(`${cred.username}:${cred.password}`).toString('base64')}`];
    default:
      // postgres_role belongs to database pools; an http origin gets nothing injected.
      return null;
  }
}

/**
 * Response headers passed back to the client. Framing (content-length, transfer-encoding) is dropped
 * because the listener frames the body itself; `date` because the listener writes its own.
 */
export function clientResponseHeaders(headers: Record<string, string | string[] | undefined>): Array<[string, string]> {
  const flat = clientResponseHeadersFlat(headers);
  const out: Array<[string, string]> = [];
  for (let i = 0; i < flat.length; i += 2) out.push([flat[i]!, flat[i + 1]!]);
  return out;
}

/** clientResponseHeaders as one flat list (name, value, …): what the node:http door writes, with no pair per header. */
export function clientResponseHeadersFlat(headers: Record<string, string | string[] | undefined>): string[] {
  const conn = headers.connection;
  const listed = connectionListed(Array.isArray(conn) ? conn.join(',') : conn);
  const out: string[] = [];
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined) continue;
    if (isHopByHop(name, listed) || name === 'content-length' || name === 'date') continue;
    if (Array.isArray(value)) for (const v of value) out.push(name, v);
    else out.push(name, value);
  }
  return out;
}
