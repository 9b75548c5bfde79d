// The `uws` front door of the proxy port (proxyHttpParser 'uws', docs/http-front-door.md): a uWebSockets.js App
// whose handler reads each request into what the core takes (an Exchange, a BodySource, a ResponseEncoder) and
// hands it on. Everything else about the request is the core's.
import type { HttpRequest, HttpResponse, TemplatedApp, us_listen_socket } from 'uWebSockets.js';
import type { DoorHandler, FrontDoor } from '../../pool-request/codec.js';
import { newExchange } from '../../pool-request/exchange.js';
import type { Snapshot } from '../../pool-request/snapshot.js';
import { loadUws } from './load.js';
import { readUwsHeaders, uwsBodySource } from './request.js';
import { UwsResponseEncoder } from './response.js';

export class UwsDoor implements FrontDoor {
  /** uWS 20.30 goes on parsing the rest of a read after a synchronous answer, even one that says close. */
  readonly answersUnreadBodyLater = true;
  readonly #app: TemplatedApp;
  #listenSocket: us_listen_socket | null = null;

  constructor(handler: DoorHandler, snapshot: () => Snapshot) {
    this.#app = loadUws().App();
    this.#app.any('/*', (res: HttpResponse, req: HttpRequest) => {
      // Everything from req is read here, synchronously: it is invalid after the handler returns.
      const method = req.getCaseSensitiveMethod();
      const client = new UwsResponseEncoder(res, method === 'HEAD');
      const headers = readUwsHeaders(req);
      const ex = newExchange(method, req.getUrl(), req.getQuery() ?? '', headers, Buffer.from(res.getRemoteAddressAsText()).toString(), snapshot());
      handler.serve(ex, uwsBodySource(res), client);
    });
  }

  /** `reusePort` is not offered: uWS threads are not run (docs/http-front-door.md). */
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

  stopListening(): void {
    if (this.#listenSocket) loadUws().us_listen_socket_close(this.#listenSocket);
    this.#listenSocket = null;
  }

  /** Drops idle keep-alive connections too (present at runtime, missing from the typings). */
  closeConnections(): void {
    (this.#app as TemplatedApp & { close(): void }).close();
  }
}
