// The client side of one pool request over node:http (proxyHttpParser 'node'): the same contract as the uWS
// ClientResponse, so the stages do not know which parser took the request. node:http answers pipelined
// requests in order, HTTP/1.0, and malformed requests itself (docs/http-front-door.md).
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Reply } from './exchange.js';
import { ClientState, type ClientSide } from './client-response.js';

export class NodeClientResponse extends ClientState implements ClientSide {
  readonly #req: IncomingMessage;
  readonly #res: ServerResponse;
  readonly #head: boolean;
  /** Body bytes handed to node so far (the uWS write offset's counterpart). */
  #written = 0;
  #writable: ((offset: number) => boolean) | null = null;

  constructor(req: IncomingMessage, res: ServerResponse, head: boolean) {
    super();
    this.#req = req;
    this.#res = res;
    this.#head = head;
    res.on('close', () => {
      if (this.isEnded && res.writableFinished) return;
      this.clientGone();
    });
  }

  pause(): void {
    if (this.open) this.#req.pause();
  }

  resume(): void {
    if (this.open) this.#req.resume();
  }

  sendReply(r: Reply, extra: ReadonlyArray<readonly [string, string]> | null, closeConnection: boolean): void {
    const body = this.startReply(r);
    if (body === null) return;
    const res = this.#res;
    const flat: string[] = ['content-type', 'application/json', 'content-length', String(Buffer.byteLength(body))];
    if (r.headers) for (const [k, v] of r.headers) flat.push(k, v);
    if (extra) for (const [k, v] of extra) flat.push(k, v);
    // node closes the connection after a response that says so (an unread body is then never parsed as a request).
    if (closeConnection) flat.push('connection', 'close');
    res.writeHead(r.status, flat);
    res.end(this.#head ? undefined : body);
  }

  #flushHead(length: number | undefined): void {
    const headers = this.takePendingHead();
    if (headers === null) return;
    const flat: string[] = [];
    for (const [k, v] of headers) flat.push(k, v);
    if (length !== undefined) flat.push('content-length', String(length));
    this.#res.writeHead(this.status, flat);
  }

  write(chunk: Uint8Array): boolean {
    if (!this.open) return false;
    this.#flushHead(undefined);
    this.#written += chunk.byteLength;
    return this.#res.write(chunk);
  }

  tryEnd(chunk: Uint8Array, total: number): [boolean, boolean] {
    if (!this.open) return [false, false];
    this.#flushHead(total);
    this.#written += chunk.byteLength;
    if (this.#written >= total) {
      this.isEnded = true;
      this.#res.end(chunk);
      return [true, true];
    }
    // node buffers the whole chunk either way: "not accepted" only asks the caller to wait for onWritable, where
    // the offset already covers this chunk (so nothing is written twice).
    return [this.#res.write(chunk), false];
  }

  writeOffset(): number {
    return this.#written;
  }

  onWritable(handler: (offset: number) => boolean): void {
    if (!this.open) return;
    if (this.#writable === null) this.#res.on('drain', () => this.#writable?.(this.#written));
    this.#writable = handler;
  }

  end(): void {
    if (!this.open) return;
    this.isEnded = true;
    this.#flushHead(undefined);
    this.#res.end();
  }

  endWithoutBody(reportedLength: number | undefined): void {
    if (!this.open) return;
    this.isEnded = true;
    this.#flushHead(reportedLength);
    this.#res.end();
  }

  close(): void {
    if (this.closing()) this.#res.destroy();
  }
}
