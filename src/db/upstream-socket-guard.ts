// The SSRF guard at connect time: a database host was checked when its pool was created, but DNS can
// change afterwards (rebinding), so every upstream connection re-checks the addresses it actually dials.
// The checks themselves are the shared guard's (src/security/ssrf-connect-guard.ts); this adapts it to pg and mysql2.
import { connect as netConnect, isIP, Socket, type LookupFunction } from 'node:net';
import { guardedLookup as sharedLookup, targetRefusal } from '../security/ssrf-connect-guard.js';
import { isPublicAddress, systemLookup } from '../security/targets.js';

function refusal(host: string, address: string): Error {
  return targetRefusal(`database host ${host}`, address);
}

/** A lookup for net.connect that refuses non-public addresses unless `allowPrivate` (allowPrivateTargets). */
export function guardedLookup(allowPrivate: boolean): LookupFunction {
  return sharedLookup({ allowPrivate, lookup: systemLookup });
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
