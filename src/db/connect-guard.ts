// The SSRF guard at connect time: a database host was checked when its pool was created, but DNS can
// change afterwards (rebinding), so every upstream connection re-checks the addresses it actually dials.
import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import { connect as netConnect, isIP, Socket, type LookupFunction } from 'node:net';
import { isPublicAddress } from '../security/targets.js';

export class PrivateTargetError extends Error {
  override name = 'PrivateTargetError';
  readonly code = 'EPRIVATETARGET';
}

function refusal(host: string, address: string): PrivateTargetError {
  return new PrivateTargetError(`database host ${host} resolves to ${address}, a loopback, private, link-local or reserved address`);
}

/** A lookup for net.connect that refuses non-public addresses unless `allowPrivate` (allowPrivateTargets). */
export function guardedLookup(allowPrivate: boolean): LookupFunction {
  return (hostname, options, callback) => {
    dnsLookup(hostname, { ...options, all: true }, (err, addresses: LookupAddress[]) => {
      if (err) return callback(err, '', 0);
      const bad = allowPrivate ? undefined : addresses.find((a) => !isPublicAddress(a.address));
      if (bad) return callback(refusal(hostname, bad.address), '', 0);
      if (options.all) return (callback as unknown as (e: null, a: LookupAddress[]) => void)(null, addresses);
      const first = addresses[0];
      if (!first) return callback(Object.assign(new Error(`database host ${hostname} does not resolve`), { code: 'ENOTFOUND' }), '', 0);
      callback(null, first.address, first.family);
    });
  };
}

/** Connects to host:port through the guard (an IP literal is checked directly: no lookup runs for it). */
export function guardedConnect(host: string, port: number, allowPrivate: boolean): Socket {
  if (isIP(host) && !allowPrivate && !isPublicAddress(host)) {
    const s = new Socket();
    process.nextTick(() => s.destroy(refusal(host, host)));
    return s;
  }
  return netConnect({ host, port, lookup: guardedLookup(allowPrivate) });
}

/** An unconnected socket whose connect(port, host) goes through the guard (pg's `stream` option calls it so). */
export function guardedSocket(allowPrivate: boolean): Socket {
  const socket = new Socket();
  const connect = socket.connect.bind(socket) as (opts: { port: number; host: string; lookup: LookupFunction }) => Socket;
  (socket as unknown as { connect: (port: number, host: string) => Socket }).connect = (port, host) => {
    if (isIP(host) && !allowPrivate && !isPublicAddress(host)) {
      process.nextTick(() => socket.destroy(refusal(host, host)));
      return socket;
    }
    return connect({ port, host, lookup: guardedLookup(allowPrivate) });
  };
  return socket;
}
