// The client address policies judge: the socket's, or, only when the socket's peer is a configured
// trusted proxy, the rightmost X-Forwarded-For entry that is not itself a trusted proxy.
import type { CidrList } from '../domain/cidr.js';
import { parseAddress } from '../domain/cidr.js';

export function clientAddress(peer: string, forwardedFor: string | undefined, trusted: CidrList): string {
  if (forwardedFor === undefined || trusted.size === 0 || !trusted.hasText(peer)) return peer;
  const hops = forwardedFor.split(',').map((h) => h.trim()).filter(Boolean);
  // Walk from the right: every hop our trusted proxies appended is skipped; the first other one is the
  // client as the last trusted proxy saw it. Anything further left was written by the client and is ignored.
  for (let i = hops.length - 1; i >= 0; i--) {
    const hop = hops[i]!;
    const addr = parseAddress(hop);
    if (addr === null) return peer; // a garbled chain proves nothing: judge the socket
    if (!trusted.has(addr)) return addr.toString();
  }
  return hops.length > 0 ? (parseAddress(hops[0]!)?.toString() ?? peer) : peer;
}
