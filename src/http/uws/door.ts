// The `uws` front door of the proxy port (proxyHttpParser 'uws', docs/http-front-door.md): a uWebSockets.js App
// whose handler reads each request into what the core takes (the head, a BodySource, a ResponseEncoder) and
// hands it on. Everything else about the request is the core's.
import type { HttpRequest, HttpResponse, TemplatedApp, us_listen_socket } from 'uWebSockets.js';
import type { BodySource, ResponseEncoder } from '../../pool-request/codec.js';
import { loadUws } from './load.js';
import { readUwsHeaders, uwsBodySource } from './request.js';
import { UwsResponseEncoder } from './response.js';

/** One request's head as the door read it (uWS's `req` is invalid once the handler returns). */
export interface DoorRequest {
  method: string;
  path: string;
  query: string;
  headers: Record<string, string>;
  clientAddress: string;
}

/** Takes a request over; must register its body reader synchronously (uWS delivers the body only to a handler set now). */
export type DoorHandler = (req: DoorRequest, body: BodySource, client: ResponseEncoder) => void;

export class UwsDoor {
  readonly #app: TemplatedApp;
  #listenSocket: us_listen_socket | null = null;

  constructor(handler: DoorHandler) {
    this.#app = loadUws().App();
    this.#app.any('/*', (res: HttpResponse, req: HttpRequest) => {
      // Everything from req is read here, synchronously.
      const method = req.getCaseSensitiveMethod();
      const client = new UwsResponseEncoder(res, method === 'HEAD');
      const head: DoorRequest = {
        method,
        path: req.getUrl(),
        query: req.getQuery() ?? '',
        headers: readUwsHeaders(req),
        clientAddress: Buffer.from(res.getRemoteAddressAsText()).toString(),
      };
      handler(head, uwsBodySource(res), client);
    });
  }

  /** Listens; resolves with the port. */
  listen(host: string, port: number): Promise<number> {
    const uws = loadUws();
    return new Promise((resolve, reject) => {
      this.#app.listen(host, port, (socket) => {
        if (!socket) {
          reject(new Error(`data plane cannot listen on ${host}:${port}`));
          return;
        }
        this.#listenSocket = socket;
        resolve(uws.us_socket_local_port(socket));
      });
    });
  }

  /** Stops accepting connections; open ones go on. */
  stopListening(): void {
    if (this.#listenSocket) loadUws().us_listen_socket_close(this.#listenSocket);
    this.#listenSocket = null;
  }

  /** Drops every connection, idle keep-alive ones too (present at runtime, missing from the typings). */
  closeConnections(): void {
    (this.#app as TemplatedApp & { close(): void }).close();
  }
}
