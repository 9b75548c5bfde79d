// JSON answers of the lock API through the core's ResponseEncoder: 2xx bodies and `{error, message}`
// refusals (spec: "Error bodies carry `error`").
import { encodeWhole, type ResponseEncoder } from '../pool-request/codec.js';
import { errorBody, type HttpCode } from '../errors/catalogue.js';

export type Headers = ReadonlyArray<readonly [string, string]>;

export function sendJson(client: ResponseEncoder, head: boolean, status: number, value: unknown, headers: Headers = []): void {
  if (!client.open || client.started) return;
  encodeWhole(client, head, status, [['content-type', 'application/json'], ...headers], Buffer.from(JSON.stringify(value)));
}

export function sendError(client: ResponseEncoder, head: boolean, status: number, error: HttpCode, message: string, headers: Headers = []): void {
  sendJson(client, head, status, errorBody(error, message), headers);
}
