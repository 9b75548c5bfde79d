// SSRF guard: origins, database hosts and webhook URLs must resolve only to public unicast addresses
// and must not name the service itself, unless allowPrivateTargets is set (local use and tests).
import { ALLOW_PRIVATE_HINT } from '../config/hints.js';
import { lookup as dnsLookup } from 'node:dns/promises';
import ipaddr from 'ipaddr.js';

export type Lookup = (host: string) => Promise<string[]>;

export const systemLookup: Lookup = async (host) => (await dnsLookup(host, { all: true, verbatim: true })).map((a) => a.address);

export interface TargetPolicy {
  allowPrivate: boolean;
  /** Host names of the service itself: the pool domain (and its subdomains) and its public hosts. */
  ownHosts: readonly string[];
  lookup: Lookup;
}

export type TargetVerdict = { ok: true } | { ok: false; reason: string };

/** True when the address is public unicast (IPv4-mapped IPv6 judged as its IPv4 address). */
export function isPublicAddress(address: string): boolean {
  if (!ipaddr.isValid(address)) return false;
  let addr = ipaddr.parse(address);
  if (addr.kind() === 'ipv6' && (addr as ipaddr.IPv6).isIPv4MappedAddress()) addr = (addr as ipaddr.IPv6).toIPv4Address();
  return addr.range() === 'unicast';
}

function stripBrackets(host: string): string {
  return host.startsWith('[') && host.endsWith(']') ? host.slice(1, -1) : host;
}

export function isOwnHost(host: string, ownHosts: readonly string[]): boolean {
  const h = host.toLowerCase().replace(/\.$/, '');
  return ownHosts.some((own) => h === own || h.endsWith(`.${own}`));
}

export async function checkTarget(rawHost: string, policy: TargetPolicy): Promise<TargetVerdict> {
  const host = stripBrackets(rawHost.toLowerCase().replace(/\.$/, ''));
  if (!host) return { ok: false, reason: 'host is empty' };
  if (isOwnHost(host, policy.ownHosts)) return { ok: false, reason: 'host is this service' };
  if (policy.allowPrivate) return { ok: true };
  if (host === 'localhost' || host.endsWith('.localhost')) return { ok: false, reason: `host is loopback; ${ALLOW_PRIVATE_HINT}` };
  let addresses: string[];
  if (ipaddr.isValid(host)) addresses = [host];
  else {
    try {
      addresses = await policy.lookup(host);
    } catch {
      return { ok: false, reason: 'host does not resolve' };
    }
  }
  if (addresses.length === 0) return { ok: false, reason: 'host does not resolve' };
  for (const a of addresses) {
    if (!isPublicAddress(a)) return { ok: false, reason: `host resolves to a loopback, private, link-local or reserved address; ${ALLOW_PRIVATE_HINT}` };
  }
  return { ok: true };
}

/**
 * Names that address this service: the pool domain and the public host names of its URLs. Addresses
 * (127.0.0.1, [::1]) and localhost are left to the address check: without a port they do not say "us",
 * and with POOLGATE_ALLOW_PRIVATE_TARGETS a loopback origin on another port is legitimate.
 */
export function ownHosts(config: { poolDomain: string }, urls: string[]): string[] {
  const hosts = new Set<string>([config.poolDomain]);
  for (const u of urls) {
    let host: string;
    try {
      host = new URL(u).hostname.toLowerCase().replace(/^\[|\]$/g, '');
    } catch {
      continue; // not a URL: nothing to add
    }
    if (!ipaddr.isValid(host) && host !== 'localhost') hosts.add(host);
  }
  return [...hosts];
}
