// Requests Node's HTTP parser refuses (oversized headers, malformed HTTP) never reach fastify's error handler;
// answer them in the Control API's `{ message }` shape too, then close the connection as Node does.
import { STATUS_CODES } from 'node:http';
import type { Socket } from 'node:net';

export function clientErrorHandler(err: Error & { code?: string }, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const [status, message] =
    err.code === 'HPE_HEADER_OVERFLOW' ? [431, 'request headers are too large']
    : err.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? [408, 'request timed out']
    : [400, 'malformed HTTP request'];
  const body = JSON.stringify({ message });
  if (socket.writable) {
    socket.write(`HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Length: ${Buffer.byteLength(body)}\r\nContent-Type: application/json; charset=utf-8\r\nConnection: close\r\n\r\n${body}`);
  }
  socket.destroy(err);
}
