// JSON answers of the lock API through the data plane's ClientResponse: 2xx bodies and `{error, message}`
// refusals (spec: "Error bodies carry `error`").
import type { ClientSide as ClientResponse } from '../pool-request/client-response.js';
import { errorBody, type HttpCode } from '../errors/catalogue.js';

export type Headers = ReadonlyArray<readonly [string, string]>;

export function sendJson(client: ClientResponse, head: boolean, status: number, value: unknown, headers: Headers = []): void {
  if (!client.open || client.started) return;
  const body = Buffer.from(JSON.stringify(value));
  client.writeHead(status, [['content-type', 'application/json'], ...headers]);
  if (head) {
    client.endWithoutBody(body.length);
    return;
  }
  const start = client.writeOffset();
  const [ok, done] = client.tryEnd(body, body.length);
  if (ok || done) return;
  // The socket is backed up: uWS took part of the body; send the rest when it drains.
  client.onWritable((offset) => client.tryEnd(body.subarray(offset - start), body.length)[0]);
}

export function sendError(client: ClientResponse, head: boolean, status: number, error: HttpCode, message: string, headers: Headers = []): void {
  sendJson(client, head, status, errorBody(error, message), headers);
}
