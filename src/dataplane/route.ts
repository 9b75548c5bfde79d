// Stage 1, route: the Host header `<subdomain>.{pool_domain}` names the pool (port ignored, any case).
import { reply, type Exchange, type Gate, type Reply } from './exchange.js';

const NOT_FOUND: Reply = reply(404, 'not_found', 'no pool at this host');

export function routeGate(poolDomain: string): Gate {
  const suffix = `.${poolDomain.toLowerCase()}`;
  return (ex: Exchange) => {
    let host = ex.headers.host ?? '';
    // Strip a port: host:port, or [v6]:port (a v6 literal never names a pool anyway).
    const colon = host.lastIndexOf(':');
    if (colon !== -1 && host.indexOf(']') < colon) host = host.slice(0, colon);
    host = host.toLowerCase();
    if (host.endsWith('.')) host = host.slice(0, -1);
    if (!host.endsWith(suffix)) return NOT_FOUND;
    const label = host.slice(0, -suffix.length);
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
