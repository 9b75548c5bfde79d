// The proxy port's node:http door (the default, docs/http-front-door.md): a node:http server whose requests go to
// the core through its first-class implementation (src/pool-request/node-http.ts). What node:http leaves to us
// happens here: pipelined requests served in order and a malformed one answered after them (node-connection.ts),
// 100 Continue once the body is wanted, CONNECT refused, and two checks llhttp does not make (version, header lines).
import type { Duplex } from 'node:stream';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { hasBody, type DoorHandler, type FrontDoor } from '../pool-request/codec.js';
import { newExchange, peerAddress, reply } from '../pool-request/exchange.js';
import { NodeResponseEncoder, nodeBodySource, readNodeHeaders } from '../pool-request/node-http.js';
import type { Snapshot } from '../pool-request/snapshot.js';
import { errorBody } from '../errors/catalogue.js';
import { nodeRequestArrived, onNodeClientError } from './node-connection.js';

const VERSION_NOT_SUPPORTED = reply(505, 'bad_request', 'only HTTP/1.0 and HTTP/1.1 are served');
/**
 * node:http's own cap is bytes (maxHeaderSize); a cap on lines answers 431 to a flood of tiny headers. 48 is the
 * most uWS 20.30 accepts (it drops a request with more), so both doors admit the same requests.
 */
const MAX_HEADER_LINES = 48;
const TOO_MANY_HEADERS = reply(431, 'bad_request', `more than ${MAX_HEADER_LINES} header lines`);

export class NodeDoor implements FrontDoor {
  readonly answersUnreadBodyLater = false;
  readonly #server: Server;
  readonly #handler: DoorHandler;
  readonly #snapshot: () => Snapshot;

  constructor(handler: DoorHandler, snapshot: () => Snapshot) {
    this.#handler = handler;
    this.#snapshot = snapshot;
    const server = createServer({ requireHostHeader: true, headersTimeout: 10_000, requestTimeout: 0, keepAliveTimeout: 10_000 });
    server.on('request', (req, res) => this.#arrived(req, res, false));
    // Expect: 100-continue comes here instead: 100 Continue goes out only once the body is wanted, after the gates.
    server.on('checkContinue', (req, res) => this.#arrived(req, res, true));
    // A malformed request is answered after the requests read before it (node-connection.ts).
    server.on('clientError', onNodeClientError);
    // node:http hands CONNECT to 'connect' (never 'request'); the proxy forwards no tunnels: answer and close.
    server.on('connect', (_req: IncomingMessage, socket: Duplex) => {
      const body = JSON.stringify(errorBody('bad_request', 'the request cannot be forwarded: CONNECT is not supported'));
      socket.end(`HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`);
    });
    this.#server = server;
  }

  listen(host: string, port: number, reusePort: boolean): Promise<number> {
    const server = this.#server;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen({ port, host, reusePort }, () => {
        server.off('error', reject);
        resolve((server.address() as { port: number }).port);
      });
    });
  }

  stopListening(): void {
    this.#server.close();
  }

  closeConnections(): void {
    this.#server.closeAllConnections();
  }

  /**
   * A request taken by node:http (llhttp has already refused malformed framing with 400/431 and closed). One
   * pipelined behind an answer that is not out yet begins once it is (node-connection.ts).
   */
  #arrived(req: IncomingMessage, res: ServerResponse, expectContinue: boolean): void {
    const when = nodeRequestArrived(req, res);
    if (when === 'now') this.#serve(req, res, expectContinue);
    else if (when === 'later') res.once('socket', () => this.#serve(req, res, expectContinue));
  }

  #serve(req: IncomingMessage, res: ServerResponse, expectContinue: boolean): void {
    const method = req.method ?? 'GET';
    // The pipelining listener nodeRequestArrived put on the response tells the encoder when it closes.
    const client = new NodeResponseEncoder(req, res, method === 'HEAD', true);
    const raw = req.rawHeaders;
    const headers = readNodeHeaders(raw);
    const url = req.url ?? '';
    const q = url.indexOf('?');
    const ex = newExchange(method, q === -1 ? url : url.slice(0, q), q === -1 ? '' : url.slice(q + 1), headers, peerAddress(req.socket.remoteAddress), this.#snapshot());
    if (req.httpVersionMajor !== 1) return this.#handler.refuse(ex, client, VERSION_NOT_SUPPORTED);
    if (raw.length / 2 > MAX_HEADER_LINES) return this.#handler.refuse(ex, client, TOO_MANY_HEADERS);
    // A body reader only for a request that has a body (most have none: no closure for them).
    this.#handler.serve(ex, hasBody(headers) ? nodeBodySource(req, res, expectContinue) : null, client);
  }
}
