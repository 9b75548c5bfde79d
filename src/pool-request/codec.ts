// The interface the pool request core owns between itself and a front door (issue 29 §2), after Envoy's
// RequestDecoder / ResponseEncoder (envoy/http/codec.h): a door hands the core the request's head (an Exchange),
// then its body as Buffers with end-of-stream (BodySource), and the core answers through a ResponseEncoder:
// headers, then body Buffers with end-of-stream, backpressure reported by the return value and lifted by a
// callback. node:http is the first-class implementation (node-http.ts); any other door is an adapter in its own
// folder (uWebSockets.js: src/http/uws/).
import type { Exchange, Reply } from './exchange.js';
import { errorBody } from '../errors/catalogue.js';

/**
 * Registers the one handler that receives the request body: each chunk as a Buffer the receiver owns (it may keep
 * it without copying), `end` true with the last one (an empty chunk when the body ends without bytes).
 */
export type BodySource = (handler: (chunk: Buffer, end: boolean) => void) => void;

/** The request declares a body (Transfer-Encoding, or a Content-Length other than 0): only then is it read. */
export function hasBody(headers: Readonly<Record<string, string>>): boolean {
  if (headers['transfer-encoding'] !== undefined) return true;
  const cl = headers['content-length'];
  return cl !== undefined && cl !== '0';
}

/** Headers as ordered name/value pairs, names lower-case. */
export type HeaderList = ReadonlyArray<readonly [string, string]>;

/** The client side of one request as the core writes to it. */
export interface ResponseEncoder {
  /** Neither aborted nor ended: writes are still allowed. */
  readonly open: boolean;
  /** The client went away before the response ended. */
  readonly aborted: boolean;
  /** A status line went out (or is about to): errors from now on can only close the connection. */
  readonly started: boolean;
  /** The status sent to the client, once a response started (0 when it was cut before its head went out). */
  status: number;
  /** An AbortSignal that fires when the client goes away. */
  signal(): AbortSignal;
  /** Runs once when the client goes away before the response ended. */
  onAbort(handler: () => void): void;
  /** Stops (and resumes) reading the request body: the receiver is backed up (Envoy's readDisable). */
  pause(): void;
  resume(): void;
  /** A whole JSON error reply with its governor headers; `closeConnection` when the request body was left unread. */
  sendReply(r: Reply, extra: HeaderList | null, closeConnection: boolean): void;
  /**
   * The status line and headers; `length` is the body's Content-Length, null when the body is sent chunked. They
   * go out with the first body bytes or the end, so a small response leaves in one write.
   */
  encodeHeaders(status: number, headers: HeaderList, length: number | null): void;
  /**
   * encodeHeaders with the headers as one flat list (name, value, name, value…), which the encoder takes over and
   * may extend: the forwarded response's head, built once, with no pair per header and no copy to flatten it.
   */
  encodeHeadersFlat(status: number, flat: string[], length: number | null): void;
  /**
   * Body bytes; `end` ends the response (with a Content-Length, the chunk that completes it must say so). The
   * encoder always takes the whole chunk: false means the client's socket is backed up, and the caller waits for
   * onWritable before it writes more.
   */
  encodeData(chunk: Buffer, end: boolean): boolean;
  /** Called each time the client's socket drained after encodeData returned false (one handler; later calls replace it). */
  onWritable(handler: () => void): void;
  /** Ends a response that has no body (HEAD, 204, 304), announcing the length a GET would have had. */
  endWithoutBody(reportedLength: number | undefined): void;
  /** Drops the connection: the only honest signal once a response is under way and cannot complete. */
  close(): void;
}

/**
 * What every encoder shares: whether the client went away, whether the response started or ended, and the
 * handlers that run once when the client goes away before the end.
 */
export abstract class ClientState {
  protected isAborted = false;
  protected isEnded = false;
  protected isStarted = false;
  status = 0;
  #pendingHead: HeaderList | string[] | null = null;
  /** The pending head is a flat name/value list (encodeHeadersFlat), not pairs. */
  protected headIsFlat = false;
  /** The Content-Length given with the pending head (null: chunked). */
  protected headLength: number | null = null;
  /** One handler (the usual case: no array per request), several, or none. */
  #onAbort: (() => void) | Array<() => void> | null = null;
  #signal: AbortSignal | null = null;

  get open(): boolean {
    return !this.isAborted && !this.isEnded;
  }

  get aborted(): boolean {
    return this.isAborted;
  }

  get started(): boolean {
    return this.isStarted;
  }

  /**
   * Made on first call: only a request that waits in the governor's queue needs one (LazyAbortSignal).
   */
  signal(): AbortSignal {
    if (this.#signal === null) {
      const controller = new AbortController();
      this.#signal = controller.signal;
      this.onAbort(() => controller.abort());
    }
    return this.#signal;
  }

  onAbort(handler: () => void): void {
    if (this.isAborted) handler();
    else if (this.isEnded) return;
    else if (this.#onAbort === null) this.#onAbort = handler;
    else if (typeof this.#onAbort === 'function') this.#onAbort = [this.#onAbort, handler];
    else this.#onAbort.push(handler);
  }

  /** The client went away: from now on nothing is written, and the abort handlers run (once). */
  protected clientGone(): void {
    this.isAborted = true;
    const handlers = this.#onAbort;
    this.#onAbort = null;
    if (handlers === null) return;
    if (typeof handlers === 'function') handlers();
    else for (const h of handlers) h();
  }

  /** Takes the status line and headers; the encoder writes them with the first body bytes or the end. */
  encodeHeaders(status: number, headers: HeaderList, length: number | null): void {
    this.#takeHead(status, headers, false, length);
  }

  /** The same with a flat list the encoder now owns (headIsFlat tells the encoder which it has). */
  encodeHeadersFlat(status: number, flat: string[], length: number | null): void {
    this.#takeHead(status, flat, true, length);
  }

  #takeHead(status: number, headers: HeaderList | string[], flat: boolean, length: number | null): void {
    if (!this.open) return;
    this.status = status;
    this.isStarted = true;
    this.#pendingHead = headers;
    this.headIsFlat = flat;
    this.headLength = length;
  }

  /** The headers encodeHeaders (pairs) or encodeHeadersFlat (flat: headIsFlat) took and that are not written yet, once (null after). */
  protected takePendingHead(): HeaderList | string[] | null {
    const headers = this.#pendingHead;
    this.#pendingHead = null;
    return headers;
  }

  /**
   * We are dropping the connection: ends the response here and tells nobody (returns false when it had ended or
   * the client had gone). A head taken but never written means the client got no response at all (status 0).
   */
  protected closing(): boolean {
    if (!this.open) return false;
    this.isEnded = true;
    if (this.#pendingHead !== null) this.status = 0;
    this.#onAbort = null; // nobody is left to tell
    return true;
  }

  /**
   * An error reply is the whole response: marks it started and ended and returns its JSON body, or null when
   * the client is gone or a response already started (then nothing is sent).
   */
  protected startReply(r: Reply): string | null {
    if (!this.open || this.isStarted) return null;
    this.status = r.status;
    this.isStarted = true;
    this.isEnded = true;
    return JSON.stringify(errorBody(r.error, r.message));
  }
}

/** The empty chunk: ends a body without bytes (encodeData(EMPTY, true)), or says a body ended. */
export const EMPTY = Buffer.alloc(0);

/** A whole body in one go (a JSON answer): headers with its length, then the bytes (or just the length for HEAD). */
export function encodeWhole(client: ResponseEncoder, head: boolean, status: number, headers: HeaderList, body: Buffer): void {
  client.encodeHeaders(status, headers, body.length);
  if (head) client.endWithoutBody(body.length);
  else client.encodeData(body, true);
}

/**
 * What a listener does with the requests a front door reads (the data plane's proxy port): `serve` takes a request
 * over (it must register its body reader synchronously: a door may deliver the body only to a reader set now);
 * `refuse` answers one the door already judged unservable (e.g. HTTP/2.0 on node:http), closes, and settles it.
 */
export interface DoorHandler {
  serve(ex: Exchange, body: BodySource | null, client: ResponseEncoder): void;
  refuse(ex: Exchange, client: ResponseEncoder, r: Reply): void;
}

/** A front door of a port: it turns each request into an Exchange, a BodySource and a ResponseEncoder. */
export interface FrontDoor {
  /** Listens; resolves with the port. `reusePort`: several threads bind the same port (SO_REUSEPORT). */
  listen(host: string, port: number, reusePort: boolean): Promise<number>;
  /** Stops accepting connections; open ones go on. */
  stopListening(): void;
  /** Drops every connection, idle keep-alive ones too. */
  closeConnections(): void;
  /**
   * The door parses bytes that follow an unread request body as a request of their own even after an answer
   * that says close (uWS 20.30): a refusal that leaves a body unread must go out on the next turn.
   */
  readonly answersUnreadBodyLater: boolean;
}
