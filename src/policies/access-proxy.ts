// Access-proxy policy: the pool sits behind an identity-aware proxy. Only connections from the configured
// proxy addresses are admitted, and they must carry the identity header; a connection from anywhere
// else is refused (not stripped), since reaching the pool around the proxy is the attack.
import type { AccessProxyPolicy } from '../store/pool-settings.js';
import { headerValue } from '../pool-request/exchange.js';
import { CidrList } from '../domain/cidr.js';
import { refuse, type Policy, type PolicyRefusal, type PolicyRequest } from './policy.js';

/**
 * oauth2-proxy's name. The identity must reach the origin, and X-Service-* headers never do (they are
 * poolgate's own), so the default is not an X-Service-* name.
 */
export const DEFAULT_IDENTITY_HEADER = 'x-auth-request-user';

const UNTRUSTED: PolicyRefusal = refuse(403, 'access_proxy', 'untrusted_source', 'this pool is reachable only through its access proxy');
const NO_IDENTITY: PolicyRefusal = refuse(401, 'access_proxy', 'missing_identity', 'the access proxy sent no identity');

export function accessProxyPolicy(cfg: AccessProxyPolicy): Policy {
  const proxies = new CidrList(cfg.proxies);
  const header = cfg.header ?? DEFAULT_IDENTITY_HEADER;
  return {
    name: 'access_proxy',
    check(req: PolicyRequest) {
      // The socket peer, never a forwarded address: the proxy itself connects to us.
      if (!proxies.hasText(req.peer)) return UNTRUSTED;
      const identity = headerValue(req.headers, header);
      return identity === undefined || identity.trim() === '' ? NO_IDENTITY : null;
    },
  };
}
