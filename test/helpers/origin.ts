// A real https origin on loopback for data plane tests: a self-signed certificate made with openssl at
// test time, a count of concurrent requests (and the peak), and paths that delay, fail, reset or stream.
//   /delay/<ms>        answer after ms          /status/<code>    answer with that status
//   /reset             destroy the socket        /download/<bytes> stream bytes (?chunked=1: no length)
//   /hop               send hop-by-hop headers   anything else     echo method, url, headers, body size
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface SeenRequest {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  bodyBytes: number;
}

export interface Origin {
  /** https://127.0.0.1:<port> */
  readonly url: string;
  readonly port: number;
  /** The certificate (PEM) to trust: pass it as originCaFile. */
  readonly caFile: string;
  /** Requests being served now, the most at once since the last reset, and the total seen. */
  readonly active: number;
  readonly peak: number;
  /**
   * Requests the origin is working on, counted from arrival until it starts its answer (a JSON answer:
   * before the first byte goes out), and the most at once since the last reset. Unlike `active` it never
   * lags behind a proxy in another thread that already has the answer and sends the next request.
   */
  readonly working: number;
  readonly workingPeak: number;
  readonly count: number;
  /** Every request seen since the last reset (bodies are counted, not kept). */
  readonly requests: readonly SeenRequest[];
  reset(): void;
  close(): Promise<void>;
}

/** A key and a self-signed certificate for 127.0.0.1 and localhost, in a temp dir. */
export function selfSignedCert(): { dir: string; keyFile: string; certFile: string } {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-origin-'));
  const keyFile = join(dir, 'key.pem');
  const certFile = join(dir, 'cert.pem');
  execFileSync(
    'openssl',
    ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', keyFile, '-out', certFile,
      '-days', '2', '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost'],
    { stdio: 'ignore' },
  );
  return { dir, keyFile, certFile };
}

const CHUNK = Buffer.alloc(64 * 1024, 0x61);

/** Writes `total` bytes with backpressure, then ends. */
function streamBytes(res: ServerResponse, total: number): void {
  let left = total;
  const pump = () => {
    while (left > 0) {
      const n = Math.min(left, CHUNK.length);
      left -= n;
      if (!res.write(n === CHUNK.length ? CHUNK : CHUNK.subarray(0, n))) {
        res.once('drain', pump);
        return;
      }
    }
    res.end();
  };
  pump();
}

export async function startOrigin(): Promise<Origin> {
  const cert = selfSignedCert();
  let active = 0;
  let working = 0;
  let workingPeak = 0;
  let peak = 0;
  let count = 0;
  let seen: SeenRequest[] = [];
  const sockets = new Set<Socket>();

  const handle = (req: IncomingMessage, res: ServerResponse, bodyBytes: number, answering: () => void) => {
    const url = new URL(req.url ?? '/', 'https://origin.test');
    const parts = url.pathname.split('/');
    const json = (status: number, value: unknown, headers: Record<string, string> = {}) => {
      const text = JSON.stringify(value);
      answering();
      res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers });
      res.end(text);
    };
    const echo = { method: req.method, url: req.url, headers: req.headers, bodyBytes };
    switch (parts[1]) {
      case 'delay':
        setTimeout(() => json(200, echo), Number(parts[2] ?? 0));
        return;
      case 'status': {
        const status = Number(parts[2] ?? 200);
        if (status === 204 || status === 304) return void res.writeHead(status).end();
        json(status, echo, status === 429 ? { 'retry-after': '7' } : {});
        return;
      }
      case 'reset':
        req.socket.destroy();
        return;
      case 'download': {
        const total = Number(parts[2] ?? 0);
        res.writeHead(200, url.searchParams.get('chunked') ? { 'content-type': 'application/octet-stream' } : {
          'content-type': 'application/octet-stream',
          'content-length': String(total),
        });
        streamBytes(res, total);
        return;
      }
      case 'hop':
        // Hop-by-hop headers an origin may send, plus one named in Connection.
        res.writeHead(200, { connection: 'keep-alive, x-hop', 'keep-alive': 'timeout=77, max=9', 'x-hop': 'secret', 'x-kept': 'yes', 'content-type': 'text/plain' });
        res.end('hop');
        return;
      default:
        json(200, echo);
    }
  };

  const server: Server = createServer({ key: readFileSync(cert.keyFile), cert: readFileSync(cert.certFile) }, (req, res) => {
    active++;
    count++;
    if (active > peak) peak = active;
    working++;
    if (working > workingPeak) workingPeak = working;
    let answered = false;
    const answering = () => {
      if (answered) return;
      answered = true;
      working--;
    };
    let done = false;
    const finish = () => {
      answering();
      if (done) return;
      done = true;
      active--;
    };
    res.on('close', finish);
    let bodyBytes = 0;
    req.on('data', (c: Buffer) => {
      bodyBytes += c.length;
    });
    req.on('error', () => {});
    req.on('end', () => {
      seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, bodyBytes });
      handle(req, res, bodyBytes, answering);
    });
  });
  server.keepAliveTimeout = 60_000;
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  // A reset socket shows up as a TLS client error here; nothing to do about it.
  server.on('tlsClientError', () => {});
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;

  return {
    url: `https://127.0.0.1:${port}`,
    port,
    caFile: cert.certFile,
    get active() {
      return active;
    },
    get peak() {
      return peak;
    },
    get working() {
      return working;
    },
    get workingPeak() {
      return workingPeak;
    },
    get count() {
      return count;
    },
    get requests() {
      return seen;
    },
    reset() {
      peak = active;
      workingPeak = working;
      count = 0;
      seen = [];
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      rmSync(cert.dir, { recursive: true, force: true });
    },
  };
}
