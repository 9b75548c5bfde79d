// `poolgate demo-origin`: a local https origin for trying poolgate without internet (README walk-through). It makes a
// self-signed certificate for 127.0.0.1 and localhost once (with the openssl CLI), keeps it in its directory so the
// configuration that trusts it (POOLGATE_ORIGIN_CA_FILE) stays valid, and answers every request with a JSON echo.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

export interface DemoOrigin {
  readonly url: string;
  readonly port: number;
  /** The certificate to trust: POOLGATE_ORIGIN_CA_FILE. */
  readonly caFile: string;
  close(): Promise<void>;
}

export class DemoOriginError extends Error {}

/** The certificate and key in `dir`, made once; openssl is the only tool needed. */
export function demoCertificate(dir: string): { certFile: string; keyFile: string } {
  const certFile = join(dir, 'cert.pem');
  const keyFile = join(dir, 'key.pem');
  if (existsSync(certFile) && existsSync(keyFile)) return { certFile, keyFile };
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  try {
    execFileSync(
      'openssl',
      ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', keyFile, '-out', certFile,
        '-days', '3650', '-subj', '/CN=poolgate demo origin', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost'],
      { stdio: 'ignore' },
    );
  } catch (err) {
    throw new DemoOriginError(`could not make a self-signed certificate with openssl (${(err as Error).message}); install openssl, or use any https origin`);
  }
  return { certFile, keyFile };
}

/** Starts the demo origin on host:port (0: a free port). `delayMs` lets a walk-through see the pool's cap at work. */
export async function startDemoOrigin(opts: { host: string; port: number; dir: string }): Promise<DemoOrigin> {
  const dir = resolve(opts.dir);
  const { certFile, keyFile } = demoCertificate(dir);
  const server: Server = createServer({ cert: readFileSync(certFile), key: readFileSync(keyFile) }, (req, res) => {
    let bytes = 0;
    req.on('data', (c: Buffer) => (bytes += c.length));
    req.on('end', () => {
      // /delay/<ms> answers late: with several at once the pool's cap and queue show in the x-service-* headers.
      const m = /^\/delay\/(\d{1,5})(?:[/?]|$)/.exec(req.url ?? '');
      const wait = m ? Math.min(Number(m[1]), 30_000) : 0;
      void sleep(wait).then(() => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ origin: 'poolgate demo origin', method: req.method, url: req.url, headers: req.headers, bodyBytes: bytes }) + '\n');
      });
    });
  });
  await new Promise<void>((ok, fail) => {
    server.once('error', (err: NodeJS.ErrnoException) =>
      fail(err.code === 'EADDRINUSE' ? new DemoOriginError(`port ${opts.port} is in use: pass --port`) : err));
    server.listen(opts.port, opts.host, () => ok());
  });
  const port = (server.address() as AddressInfo).port;
  const hostForUrl = opts.host.includes(':') ? `[${opts.host}]` : opts.host;
  return {
    url: `https://${hostForUrl}:${port}`,
    port,
    caFile: certFile,
    close: () =>
      new Promise<void>((ok) => {
        server.close(() => ok());
        server.closeAllConnections();
      }),
  };
}
