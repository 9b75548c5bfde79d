// One node:http connection of the proxy port, for pipelining (issue 25 item 1). node:http parses every request of a
// pipelined write at once and hands each to the proxy while the answers before it are still pending; it then
// drops the queued answers when one before them closes the connection (a refusal) and destroys the connection,
// answers and all, on a malformed request. So: a request behind an unfinished answer begins only once that
// answer is out (served in order, like nginx: nothing behind a refusal that closes reaches the origin), and the
// answer to a malformed request goes out after the answers to the requests read before it.
import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { errorBody, httpStatus, type HttpCode } from '../errors/catalogue.js';
import { nodeResponseClosed } from '../pool-request/node-http.js';

const OPEN = Symbol('requests read on this connection and not yet answered');
const FAILED = Symbol('the answer to a malformed request, sent once the ones before it are out');

const LAST = Symbol('the response to the last request read on this connection');

interface ProxySocket extends Socket {
  [OPEN]?: number;
  [FAILED]?: string;
  [LAST]?: ServerResponse;
}

/**
 * A request node:http read. 'now': it may begin; 'later': an answer before it on the connection is not out yet,
 * and it begins at `res`'s 'socket' event (node:http gives a response its socket once the answers before it have
 * finished; never, when one of them closed the connection).
 */
export function nodeRequestArrived(req: IncomingMessage, res: ServerResponse): 'now' | 'later' | 'never' {
  const socket = req.socket as ProxySocket;
  // An answer before it closed the connection (a refusal, HTTP/1.0): node:http may already have let go of that
  // answer and handed this one the closing socket. Nothing behind a close is served.
  if (socket.destroyed || socket.writableEnded) return 'never';
  socket[OPEN] = (socket[OPEN] ?? 0) + 1;
  socket[LAST] = res;
  // on, not once: a response closes once, and once() would wrap the listener per request.
  res.on('close', requestEnded);
  return res.socket !== null ? 'now' : 'later';
}

/**
 * A response's 'close' (one function for all of them): its answer is over, finished or cut. It is also the
 * response's only 'close' listener: its encoder (node-door.ts) is told from here, not from a listener of its own.
 */
function requestEnded(this: ServerResponse): void {
  nodeRequestEnded(this.req.socket);
  nodeResponseClosed(this);
}

/** The answer to a request of `socket` is over: a pending parse error answer may go out. */
function nodeRequestEnded(socket: Socket): void {
  const s = socket as ProxySocket;
  const open = (s[OPEN] ?? 1) - 1;
  s[OPEN] = open;
  if (open === 0 && s[FAILED] !== undefined) sendFailure(s);
}

function answer(status: number, code: HttpCode, message: string): string {
  const body = JSON.stringify(errorBody(code, message));
  return `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`;
}

const MALFORMED = answer(httpStatus('bad_request'), 'bad_request', 'malformed HTTP request');
const HEADERS_TOO_LARGE = answer(431, 'bad_request', 'request headers are too large');
const HEADERS_TIMEOUT = answer(httpStatus('request_timeout'), 'request_timeout', 'the request headers did not arrive in time');

/** node:http's clientError: what llhttp refused (or a header timeout), answered after the answers before it. */
export function onNodeClientError(err: Error & { code?: string }, socket: Socket): void {
  const s = socket as ProxySocket;
  if (s[FAILED] !== undefined) return;
  if (err.code === 'ECONNRESET' || !socket.writable) {
    socket.destroy();
    return;
  }
  s[FAILED] = err.code === 'HPE_HEADER_OVERFLOW' ? HEADERS_TOO_LARGE : err.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? HEADERS_TIMEOUT : MALFORMED;
  const last = s[LAST];
  if (last !== undefined && !last.req.complete) {
    // The malformed bytes are in the body of a request being served (a broken chunk): it can never complete, so
    // nothing is waited for. Answered at once and closed, as node:http does, unless an answer is already going out.
    if (s[OPEN] === 1 && !last.headersSent) s.write(s[FAILED], 'latin1');
    socket.destroy();
    return;
  }
  // Nothing more is parsed on this connection (llhttp stays in its error state).
  socket.pause();
  if ((s[OPEN] ?? 0) === 0) sendFailure(s);
}

function sendFailure(s: ProxySocket): void {
  const text = s[FAILED]!;
  if (s.destroyed || !s.writable) return;
  s.end(text, 'latin1');
  // A client that keeps its side open must not hold the connection: gone once the answer is flushed.
  s.once('finish', () => s.destroy());
}
