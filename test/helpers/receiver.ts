// A real https webhook receiver on loopback for delivery tests: a self-signed certificate made at test
// time, every request kept with its raw body, and a behaviour per path chosen by the test:
//   ok (200), status <code>, hang (never answers), reset (destroys the socket), redirect (302 to /ok),
//   huge (200 and then an endless stream of bytes, ~1 GB), and a queue of one-shot behaviours per path.
import { readFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { selfSignedCert } from './origin.js';

export type Behaviour = 'ok' | 'hang' | 'reset' | 'redirect' | 'huge' | { status: number };

export interface Received {
  method: string;
  path: string;
  headers: IncomingMessage['headers'];
  rawBody: Buffer;
  at: number;
}

export interface Receiver {
  readonly url: string;
  /** The certificate to trust (webhookCaFile). */
  readonly caFile: string;
  /** Requests whose body arrived, in order. */
  readonly received: Received[];
  /** Requests being answered now (hanging ones included). */
  readonly active: number;
  /** Bytes of the huge answer written so far. */
  readonly hugeBytesWritten: number;
  /** Sets the standing behaviour of a path (default: ok). */
  on(path: string, b: Behaviour): void;
  /** Queues one-shot behaviours for a path, used before the standing one. */
  queue(path: string, ...b: Behaviour[]): void;
  /** Resolves when `n` requests to `path` have arrived. */
  waitFor(path: string, n: number, timeoutMs?: number): Promise<Received[]>;
  close(): Promise<void>;
}

const HUGE_TOTAL = 1024 ** 3;
const CHUNK = Buffer.alloc(64 * 1024, 0x7a);

export async function startReceiver(): Promise<Receiver> {
  const cert = selfSignedCert();
  const standing = new Map<string, Behaviour>();
  const queued = new Map<string, Behaviour[]>();
  const received: Received[] = [];
  const waiters = new Set<() => void>();
  const sockets = new Set<Socket>();
  let active = 0;
  let hugeBytes = 0;

  const behave = (path: string, req: IncomingMessage, res: ServerResponse) => {
    const q = queued.get(path);
    const b: Behaviour = q?.shift() ?? standing.get(path) ?? 'ok';
    if (b === 'ok') return void res.writeHead(200, { 'content-type': 'text/plain' }).end('ok');
    if (b === 'hang') return; // the socket stays open until the client gives up
    if (b === 'reset') return void req.socket.destroy();
    if (b === 'redirect') return void res.writeHead(302, { location: '/ok' }).end();
    if (b === 'huge') {
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(HUGE_TOTAL) });
      let left = HUGE_TOTAL;
      const pump = () => {
        while (left > 0 && !res.destroyed) {
          left -= CHUNK.length;
          hugeBytes += CHUNK.length;
          if (!res.write(CHUNK)) return void res.once('drain', pump);
        }
        res.end();
      };
      pump();
      return;
    }
    res.writeHead(b.status, { 'content-type': 'text/plain' }).end(`status ${b.status}`);
  };

  const server: Server = createServer({ key: readFileSync(cert.keyFile), cert: readFileSync(cert.certFile) }, (req, res) => {
    active++;
    res.on('close', () => active--);
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('error', () => {});
    req.on('end', () => {
      const path = new URL(req.url ?? '/', 'https://receiver.test').pathname;
      received.push({ method: req.method ?? '', path, headers: req.headers, rawBody: Buffer.concat(chunks), at: Date.now() });
      for (const w of [...waiters]) w();
      behave(path, req, res);
    });
  });
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.on('tlsClientError', () => {});
  // Idle connections are kept a minute (Node's default is 5 s): on a loaded machine the deliverer could reuse
  // one the receiver was closing, and a test would see an ECONNRESET it did not ask for.
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;

  return {
    url: `https://127.0.0.1:${port}`,
    caFile: cert.certFile,
    received,
    get active() {
      return active;
    },
    get hugeBytesWritten() {
      return hugeBytes;
    },
    on(path, b) {
      standing.set(path, b);
    },
    queue(path, ...b) {
      queued.set(path, [...(queued.get(path) ?? []), ...b]);
    },
    waitFor(path, n, timeoutMs = 20_000) {
      const got = () => received.filter((r) => r.path === path);
      if (got().length >= n) return Promise.resolve(got());
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`receiver: ${got().length} of ${n} requests to ${path} within ${timeoutMs} ms`));
        }, timeoutMs);
        const check = () => {
          if (got().length < n) return;
          clearTimeout(timer);
          waiters.delete(check);
          resolve(got());
        };
        waiters.add(check);
      });
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      rmSync(cert.dir, { recursive: true, force: true });
    },
  };
}
