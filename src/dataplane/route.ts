// Stage 1, route: the Host header `<subdomain>.{pool_domain}` names the pool (port ignored, any case). A client that
// cannot set Host (fetch drops it; *.localhost may not resolve) names the pool in `X-Service-Pool: <subdomain>`,
// read only when the Host is not under the pool domain (docs/http-data-plane.md).
import { reply, type Exchange, type Stage, type Reply } from '../pool-request/exchange.js';

const NOT_FOUND: Reply = reply(404, 'not_found', 'no pool at this host');
const NO_POOL_NAMED: Reply = reply(404, 'not_found', 'no pool named: send Host <subdomain>.<pool domain> or X-Service-Pool: <subdomain>');
const POOL_HEADER = 'x-service-pool';

export function routeStage(poolDomain: string): Stage {
  const suffix = `.${poolDomain.toLowerCase()}`;
  return (ex: Exchange) => {
    let host = ex.headers.host ?? '';
    // Strip a port: host:port, or [v6]:port (a v6 literal never names a pool anyway).
    const colon = host.lastIndexOf(':');
    if (colon !== -1 && host.indexOf(']') < colon) host = host.slice(0, colon);
    host = host.toLowerCase();
    if (host.endsWith('.')) host = host.slice(0, -1);
    let label: string;
    if (host.endsWith(suffix)) label = host.slice(0, -suffix.length);
    else {
      // Off the usual path: only requests whose Host names no pool look at the header.
      const named = ex.headers[POOL_HEADER];
      if (typeof named !== 'string' || named.length === 0) return NO_POOL_NAMED;
      label = named.toLowerCase();
    }
    if (label.length === 0 || label.includes('.')) return NOT_FOUND;
    const pool = ex.snapshot.pools.get(label);
    if (!pool) return NOT_FOUND;
    if (pool.status !== 'active') return reply(503, 'unavailable', 'this pool is suspended');
    // Database pools (postgres, mysql) have no origin: they are served by SQL over HTTP (src/db).
    if (pool.backend === 'http' && pool.origin === null) return reply(503, 'unavailable', 'this pool has no usable origin');
    ex.pool = pool;
    return null;
  };
}
