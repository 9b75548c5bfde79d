// IP allowlist policy: the client address must be inside one of the pool's CIDR ranges (IPv4 or IPv6).
import { CidrList } from './cidr.js';
import { refuse, type Policy, type PolicyRefusal, type PolicyRequest } from './policy.js';

const MISS: PolicyRefusal = refuse(403, 'ip_allowlist', 'not_allowed', 'this client address is not allowed on this pool');

export function ipAllowlistPolicy(cidrs: readonly string[]): Policy {
  const list = new CidrList(cidrs);
  return {
    name: 'ip_allowlist',
    check: (req: PolicyRequest) => (list.hasText(req.client) ? null : MISS),
  };
}
