// Requests Node's HTTP parser refuses (oversized headers, malformed HTTP) never reach fastify's error handler;
// answer them in the Control API's `{ message }` shape too, then close the connection as Node does.
import { STATUS_CODES } from 'node:http';
import type { Socket } from 'node:net';
import { httpStatus, type HttpStatusOf } from '../errors/catalogue.js';

/** The catalogue's `bad_request` is also sent as 431 when headers are too large. */
const HEADERS_TOO_LARGE: HttpStatusOf<'bad_request'> = 431;

export function clientErrorHandler(err: Error & { code?: string }, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const [status, message] =
    err.code === 'HPE_HEADER_OVERFLOW' ? [HEADERS_TOO_LARGE, 'request headers are too large']
    : err.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? [httpStatus('request_timeout'), 'request timed out']
    : [httpStatus('bad_request'), 'malformed HTTP request'];
  const body = JSON.stringify({ message });
  if (socket.writable) {
    socket.write(`HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Length: ${Buffer.byteLength(body)}\r\nContent-Type: application/json; charset=utf-8\r\nConnection: close\r\n\r\n${body}`);
  }
  socket.destroy(err);
}
