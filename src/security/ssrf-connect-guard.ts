// The SSRF guard at connect time, shared by every outbound client (origins, JWKS, webhook receivers,
// database hosts): a host checked when it was configured can resolve elsewhere later (DNS rebinding), so
// each new connection re-checks the addresses it actually dials. It runs per connection, not per request.
import { isIP, type LookupFunction } from 'node:net';
import { buildConnector } from 'undici';
import { isPublicAddress, type Lookup } from './targets.js';
import { ALLOW_PRIVATE_HINT } from '../config/hints.js';

/** What the guard needs: allowPrivateTargets, and the resolver (the service's, so tests can map names). */
export interface ConnectTargets {
  allowPrivate: boolean;
  lookup: Lookup;
}

/** The error code of a connection the guard refused. */
export const TARGET_REFUSED = 'ETARGETREFUSED';

export function targetRefusal(host: string, address: string): Error {
  const what = host === address ? address : `${host} resolves to ${address}`;
  return Object.assign(new Error(`${what}, a loopback, private, link-local or reserved address: refused at connect time (${ALLOW_PRIVATE_HINT})`), {
    code: TARGET_REFUSED,
  });
}

/** The guard's refusal, when the error (or its cause) is one; null otherwise. */
export function targetRefusalOf(err: unknown): Error | null {
  const e = err as (Error & { code?: string; cause?: unknown }) | null;
  if (e?.code === TARGET_REFUSED) return e;
  const c = e?.cause as (Error & { code?: string }) | undefined;
  return c?.code === TARGET_REFUSED ? c : null;
}

/** A `lookup` for net/tls connect: resolves through `targets.lookup` and refuses a non-public answer. */
export function guardedLookup(targets: ConnectTargets): LookupFunction {
  return (hostname, options, callback) => {
    targets.lookup(hostname).then(
      (found) => {
        const want = options.family as number | string | undefined;
        const family = want === 4 || want === 'IPv4' ? 4 : want === 6 || want === 'IPv6' ? 6 : 0;
        const list = found
          .map((address) => ({ address, family: address.includes(':') ? 6 : 4 }))
          .filter((a) => family === 0 || a.family === family);
        if (list.length === 0) return callback(Object.assign(new Error(`${hostname} does not resolve`), { code: 'ENOTFOUND' }), '');
        const bad = targets.allowPrivate ? undefined : list.find((a) => !isPublicAddress(a.address));
        if (bad) return callback(targetRefusal(hostname, bad.address), '');
        if (options.all) callback(null, list);
        else callback(null, list[0]!.address, list[0]!.family);
      },
      (err: NodeJS.ErrnoException) => callback(err, ''),
    );
  };
}

/** An IP literal is dialled without a lookup: it is judged here instead. Null when it may be dialled. */
export function literalRefusal(host: string, targets: ConnectTargets): Error | null {
  const h = host.startsWith('[') && host.endsWith(']') ? host.slice(1, -1) : host;
  if (targets.allowPrivate || !isIP(h) || isPublicAddress(h)) return null;
  return targetRefusal(h, h);
}

/**
 * An undici connector (Pool/Agent `connect`) that refuses non-public addresses, IP literals included,
 * unless allowPrivate; `tls` carries the usual connect options (secureContext, timeouts).
 */
export function guardedConnector(targets: ConnectTargets, tls: buildConnector.BuildOptions = {}): buildConnector.connector {
  const base = buildConnector({ ...tls, lookup: guardedLookup(targets) } as buildConnector.BuildOptions);
  return (opts, callback) => {
    const refused = literalRefusal(opts.hostname, targets);
    if (refused) {
      process.nextTick(() => callback(refused, null));
      return;
    }
    base(opts, callback);
  };
}
