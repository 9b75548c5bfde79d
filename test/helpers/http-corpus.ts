// The HTTP/1.1 framing corpus of issue 15: byte sequences a front door must answer exactly (RFC 9110/9112),
// each with the answer an operator exposing the proxy to the internet expects. Shared by the conformance test
// (against poolgate) and scripts/front-door-corpus.ts (against nginx, for the table in
// docs/http-front-door.md).
import { connect } from 'node:net';

export interface CorpusCase {
  name: string;
  /** The bytes, given the Host and the request path the origin would see. */
  bytes(host: string, path: string, key: string): string;
  /** Status codes in order; [] means no answer is right (nothing was a complete request). */
  statuses: number[];
  /** The connection must be closed by the server after the answers. */
  closes: boolean;
  /** Requests that may reach the origin: paths derived from the case's path. */
  reaches: (path: string) => string[];
}

const H = (host: string, key: string) => `Host: ${host}\r\nX-Service-Key: ${key}\r\n`;
const none = () => [];
const one = (p: string) => [p];

export const CORPUS: CorpusCase[] = [
  { name: 'valid GET', bytes: (h, p, k) => `GET ${p} HTTP/1.1\r\n${H(h, k)}\r\n`, statuses: [200], closes: false, reaches: one },
  {
    name: 'valid chunked POST',
    bytes: (h, p, k) => `POST ${p} HTTP/1.1\r\n${H(h, k)}Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n`,
    statuses: [200],
    closes: false,
    reaches: one,
  },
  {
    name: 'two Content-Length, smuggled request behind the body',
    bytes: (h, p, k) =>
      `POST ${p} HTTP/1.1\r\n${H(h, k)}Content-Length: 5\r\nContent-Length: 90\r\n\r\nhelloGET ${p}/SMUGGLED HTTP/1.1\r\n${H(h, k)}\r\n`,
    statuses: [400],
    closes: true,
    reaches: none,
  },
  {
    name: 'two Content-Length',
    bytes: (h, p, k) => `POST ${p} HTTP/1.1\r\n${H(h, k)}Content-Length: 5\r\nContent-Length: 90\r\n\r\nhello`,
    statuses: [400],
    closes: true,
    reaches: none,
  },
  {
    name: 'Content-Length list 5, 5',
    bytes: (h, p, k) => `POST ${p} HTTP/1.1\r\n${H(h, k)}Content-Length: 5, 5\r\n\r\nhello`,
    statuses: [400],
    closes: true,
    reaches: none,
  },
  {
    name: 'Content-Length not digits',
    bytes: (h, p, k) => `POST ${p} HTTP/1.1\r\n${H(h, k)}Content-Length: +5\r\n\r\nhello`,
    statuses: [400],
    closes: true,
    reaches: none,
  },
  ...[
    ['gzip', 400],
    ['xchunked', 400],
    ['chunked, identity', 400],
    ['chunked, chunked', 400],
    ['gzip, chunked', 501],
  ].map(([te, status]) => ({
    name: `Transfer-Encoding: ${te}`,
    bytes: (h: string, p: string, k: string) => `POST ${p} HTTP/1.1\r\n${H(h, k)}Transfer-Encoding: ${te}\r\n\r\n3\r\nabc\r\n0\r\n\r\n`,
    statuses: [status as number],
    closes: true,
    reaches: none,
  })),
  {
    name: 'Transfer-Encoding and Content-Length',
    bytes: (h, p, k) => `POST ${p} HTTP/1.1\r\n${H(h, k)}Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n`,
    statuses: [400],
    closes: true,
    reaches: none,
  },
  {
    name: 'two pipelined GETs in one write',
    bytes: (h, p, k) => `GET ${p}/1 HTTP/1.1\r\n${H(h, k)}\r\nGET ${p}/2 HTTP/1.1\r\n${H(h, k)}\r\n`,
    statuses: [200, 200],
    closes: false,
    reaches: (p) => [`${p}/1`, `${p}/2`],
  },
  { name: 'HTTP/1.0', bytes: (h, p, k) => `GET ${p} HTTP/1.0\r\n${H(h, k)}\r\n`, statuses: [200], closes: true, reaches: one },
  {
    name: 'HTTP/1.0 keep-alive',
    bytes: (h, p, k) => `GET ${p} HTTP/1.0\r\n${H(h, k)}Connection: keep-alive\r\n\r\n`,
    statuses: [200],
    closes: false,
    reaches: one,
  },
  { name: 'bare LF line endings', bytes: (h, p, k) => `GET ${p} HTTP/1.1\n${H(h, k).replace(/\r\n/g, '\n')}\n`, statuses: [400], closes: true, reaches: none },
  { name: 'bare CR line endings', bytes: (h, p, k) => `GET ${p} HTTP/1.1\r${H(h, k).replace(/\r\n/g, '\r')}\r`, statuses: [400], closes: true, reaches: none },
  { name: 'space in a header name', bytes: (h, p, k) => `GET ${p} HTTP/1.1\r\n${H(h, k)}Bad Name: 1\r\n\r\n`, statuses: [400], closes: true, reaches: none },
  { name: 'NUL in a header value', bytes: (h, p, k) => `GET ${p} HTTP/1.1\r\n${H(h, k)}X-A: a\0b\r\n\r\n`, statuses: [400], closes: true, reaches: none },
  { name: 'no Host (HTTP/1.1)', bytes: (_h, p, k) => `GET ${p} HTTP/1.1\r\nX-Service-Key: ${k}\r\n\r\n`, statuses: [400], closes: true, reaches: none },
  { name: 'obs-fold', bytes: (h, p, k) => `GET ${p} HTTP/1.1\r\n${H(h, k)}X-A: a\r\n b\r\n\r\n`, statuses: [400], closes: true, reaches: none },
  {
    name: 'absolute-form target, other host',
    bytes: (h, p, k) => `GET http://elsewhere.example${p} HTTP/1.1\r\n${H(h, k)}\r\n`,
    statuses: [400],
    closes: true,
    reaches: none,
  },
  {
    name: '60 header lines',
    bytes: (h, p, k) => `GET ${p} HTTP/1.1\r\n${H(h, k)}${Array.from({ length: 58 }, (_, i) => `X-${i}: 1\r\n`).join('')}\r\n`,
    statuses: [431],
    closes: true,
    reaches: none,
  },
  { name: 'HTTP/2.0 in a request line', bytes: (h, p, k) => `GET ${p} HTTP/2.0\r\n${H(h, k)}\r\n`, statuses: [505], closes: true, reaches: none },
  { name: 'HTTP/1.x version', bytes: (h, p, k) => `GET ${p} HTTP/1.x\r\n${H(h, k)}\r\n`, statuses: [400], closes: true, reaches: none },
  {
    name: 'Expect: 100-continue with a wrong key',
    bytes: (h, p) => `POST ${p} HTTP/1.1\r\n${H(h, 'pgk_wrong')}Expect: 100-continue\r\nContent-Length: 3\r\n\r\n`,
    statuses: [401],
    closes: true,
    reaches: none,
  },
  // Issue 25: what a refused request leaves behind, and framing details.
  {
    name: 'refused POST with a body, a valid GET pipelined behind it',
    bytes: (h, p, k) =>
      `POST ${p}/x HTTP/1.1\r\n${H(h, 'pgk_wrong')}Content-Length: 5\r\n\r\nhelloGET ${p}/good HTTP/1.1\r\n${H(h, k)}\r\n`,
    statuses: [401],
    closes: true,
    reaches: none,
  },
  {
    name: 'Transfer-Encoding: gzip, chunked, a valid GET pipelined behind it',
    bytes: (h, p, k) =>
      `POST ${p}/x HTTP/1.1\r\n${H(h, k)}Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET ${p}/good HTTP/1.1\r\n${H(h, k)}\r\n`,
    statuses: [501],
    closes: true,
    reaches: none,
  },
  {
    name: 'refused GET (no body), a valid GET pipelined behind it',
    bytes: (h, p, k) => `GET ${p}/x HTTP/1.1\r\n${H(h, 'pgk_wrong')}\r\nGET ${p}/good HTTP/1.1\r\n${H(h, k)}\r\n`,
    statuses: [401, 200],
    closes: false,
    reaches: (p) => [`${p}/good`],
  },
  {
    name: 'two valid GETs, then a malformed request, in one write',
    bytes: (h, p, k) => `GET ${p}/1 HTTP/1.1\r\n${H(h, k)}\r\nGET ${p}/2 HTTP/1.1\r\n${H(h, k)}\r\nGET ${p}/3 HTTP/1.1\r\n${H(h, k)}Bad Name: 1\r\n\r\n`,
    statuses: [200, 200, 400],
    closes: true,
    reaches: (p) => [`${p}/1`, `${p}/2`],
  },
  ...['Chunked', 'CHUNKED'].map((te) => ({
    name: `Transfer-Encoding: ${te} (coding names are case-insensitive)`,
    bytes: (h: string, p: string, k: string) => `POST ${p} HTTP/1.1\r\n${H(h, k)}Transfer-Encoding: ${te}\r\n\r\n3\r\nabc\r\n0\r\n\r\n`,
    statuses: [200],
    closes: false,
    reaches: one,
  })),
  {
    name: 'chunked POST whose chunk size is malformed',
    bytes: (h, p, k) => `POST ${p} HTTP/1.1\r\n${H(h, k)}Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n`,
    statuses: [400],
    closes: true,
    reaches: none,
  },
  {
    name: 'two Host headers',
    bytes: (h, p, k) => `GET ${p} HTTP/1.1\r\n${H(h, k)}Host: ${h}\r\n\r\n`,
    statuses: [400],
    closes: true,
    reaches: none,
  },
];

export interface RawResult {
  /** Every status line received, in order (interim 1xx included). */
  statuses: number[];
  closed: boolean;
  raw: string;
}

/** Writes `bytes` on a fresh connection; resolves when the server closes or `waitMs` passed after the last byte. */
export function sendRaw(port: number, bytes: string, waitMs: number, host = '127.0.0.1'): Promise<RawResult> {
  return new Promise((resolve) => {
    const sock = connect(port, host, () => sock.write(Buffer.from(bytes, 'latin1')));
    let raw = '';
    let done = false;
    let timer = setTimeout(() => finish(false), waitMs);
    const finish = (closed: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      const statuses = [...raw.matchAll(/HTTP\/1\.[01] (\d{3}) /g)].map((m) => Number(m[1]));
      resolve({ statuses, closed, raw });
    };
    sock.on('data', (c: Buffer) => {
      raw += c.toString('latin1');
      clearTimeout(timer);
      timer = setTimeout(() => finish(false), waitMs);
    });
    sock.on('close', () => finish(true));
    sock.on('error', () => {});
  });
}
