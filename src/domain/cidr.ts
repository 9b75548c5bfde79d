// CIDR lists (IPv4 and IPv6) parsed once, and the membership test the IP allowlist, the access proxy
// and the trusted-proxy list share. IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) count as IPv4.
import ipaddr from 'ipaddr.js';

type Address = ipaddr.IPv4 | ipaddr.IPv6;
type Range = [Address, number];

/** One CIDR (or a bare address, meaning /32 or /128); throws a readable error when it is not one. */
export function parseCidr(text: string): Range {
  const s = text.trim();
  try {
    if (s.includes('/')) {
      const [addr, bits] = ipaddr.parseCIDR(s);
      // ::ffff:10.0.0.0/104 is the IPv4 range 10.0.0.0/8: clients arrive as IPv4 after process().
      if (addr.kind() === 'ipv6' && (addr as ipaddr.IPv6).isIPv4MappedAddress() && bits >= 96) {
        return [(addr as ipaddr.IPv6).toIPv4Address(), bits - 96];
      }
      return [addr, bits];
    }
    const addr = ipaddr.process(s);
    return [addr, addr.kind() === 'ipv4' ? 32 : 128];
  } catch {
    throw new Error(`${JSON.stringify(text)} is not an IPv4 or IPv6 address or CIDR range`);
  }
}

/** The address as ipaddr.js sees it, IPv4-mapped IPv6 turned into IPv4; null when it is not an address. */
export function parseAddress(text: string): Address | null {
  try {
    return ipaddr.process(text.trim());
  } catch {
    return null;
  }
}

export class CidrList {
  readonly #v4: Range[] = [];
  readonly #v6: Range[] = [];

  constructor(cidrs: readonly string[]) {
    for (const c of cidrs) {
      const r = parseCidr(c);
      (r[0].kind() === 'ipv4' ? this.#v4 : this.#v6).push(r);
    }
  }

  get size(): number {
    return this.#v4.length + this.#v6.length;
  }

  has(addr: Address | null): boolean {
    if (addr === null) return false;
    const ranges = addr.kind() === 'ipv4' ? this.#v4 : this.#v6;
    for (const r of ranges) if (addr.match(r as never)) return true;
    return false;
  }

  hasText(text: string): boolean {
    return this.has(parseAddress(text));
  }
}
