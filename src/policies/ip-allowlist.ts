// IP allowlist policy: the client address must be inside one of the pool's CIDR ranges (IPv4 or IPv6).
import { CidrList } from '../domain/cidr.js';
import { refuse, type Policy, type PolicyRefusal, type PolicyRequest } from './policy.js';

const MISS: PolicyRefusal = refuse(403, 'ip_allowlist', 'not_allowed', 'this client address is not allowed on this pool');

export function ipAllowlistPolicy(cidrs: readonly string[]): Policy {
  const list = new CidrList(cidrs);
  // Parsing the address text is most of the cost, and a pool sees few distinct clients: remember answers.
  const seen = new Map<string, boolean>();
  return {
    name: 'ip_allowlist',
    check(req: PolicyRequest) {
      let ok = seen.get(req.client);
      if (ok === undefined) {
        if (seen.size >= 4096) seen.clear();
        ok = list.hasText(req.client);
        seen.set(req.client, ok);
      }
      return ok ? null : MISS;
    },
  };
}
