// The client side of one pool request over uWS: every write is corked, and nothing touches the uWS
// response after it was aborted or ended (both forbidden by uWS).
import { STATUS_CODES } from 'node:http';
import type { HttpResponse } from 'uWebSockets.js';
import type { Reply } from './exchange.js';
import { errorBody } from '../errors/catalogue.js';

const statusLines = new Map<number, string>();
function statusLine(status: number): string {
  let line = statusLines.get(status);
  if (line === undefined) {
    line = `${status} ${STATUS_CODES[status] ?? 'Unknown'}`;
    statusLines.set(status, line);
  }
  return line;
}

/**
 * The client side of one request as the stages use it: implemented over uWS (ClientResponse) and over node:http
 * (NodeClientResponse, src/pool-request/node-client-response.ts) for the `node` proxy parser.
 */
export interface ClientSide {
  readonly open: boolean;
  readonly aborted: boolean;
  readonly started: boolean;
  status: number;
  signal(): AbortSignal;
  onAbort(handler: () => void): void;
  pause(): void;
  resume(): void;
  sendReply(r: Reply, extra: ReadonlyArray<readonly [string, string]> | null, closeConnection: boolean): void;
  writeHead(status: number, headers: ReadonlyArray<readonly [string, string]>): void;
  write(chunk: Uint8Array): boolean;
  tryEnd(chunk: Uint8Array, total: number): [boolean, boolean];
  writeOffset(): number;
  onWritable(handler: (offset: number) => boolean): void;
  end(): void;
  endWithoutBody(reportedLength: number | undefined): void;
  close(): void;
}

/**
 * What both client sides share: whether the client went away, whether the response started or ended, and the
 * handlers that run once when the client goes away before the end.
 */
export abstract class ClientState {
  protected isAborted = false;
  protected isEnded = false;
  protected isStarted = false;
  /** The status sent to the client, once a response started (0 again when it was cut before its head went out). */
  status = 0;
  #pendingHead: ReadonlyArray<readonly [string, string]> | null = null;
  #onAbort: Array<() => void> = [];
  #signal: AbortSignal | null = null;

  /** Neither aborted nor ended: writes are still allowed. */
  get open(): boolean {
    return !this.isAborted && !this.isEnded;
  }

  get aborted(): boolean {
    return this.isAborted;
  }

  /** A status line went out: errors from now on can only close the connection. */
  get started(): boolean {
    return this.isStarted;
  }

  /**
   * An AbortSignal that fires when the client goes away, made on first call: only a request that waits in the
   * governor's queue needs one (LazyAbortSignal).
   */
  signal(): AbortSignal {
    if (this.#signal === null) {
      const controller = new AbortController();
      this.#signal = controller.signal;
      this.onAbort(() => controller.abort());
    }
    return this.#signal;
  }

  /** Runs once when the client goes away before the response ended. */
  onAbort(handler: () => void): void {
    if (this.isAborted) handler();
    else if (!this.isEnded) this.#onAbort.push(handler);
  }

  /** The client went away: from now on nothing is written, and the abort handlers run (once). */
  protected clientGone(): void {
    this.isAborted = true;
    const handlers = this.#onAbort;
    this.#onAbort = [];
    for (const h of handlers) h();
  }

  /**
   * Takes the status line and headers; they are written with the first body bytes (or the end), so a small
   * response leaves in one send instead of two.
   */
  writeHead(status: number, headers: ReadonlyArray<readonly [string, string]>): void {
    if (!this.open) return;
    this.status = status;
    this.isStarted = true;
    this.#pendingHead = headers;
  }

  /** The headers writeHead took and that are not written yet, once (null after). */
  protected takePendingHead(): ReadonlyArray<readonly [string, string]> | null {
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
    this.#onAbort = []; // nobody is left to tell
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

export class ClientResponse extends ClientState implements ClientSide {
  readonly #res: HttpResponse;
  #writable: ((offset: number) => boolean) | null = null;
  readonly #head: boolean;

  /** `head`: the request was HEAD, so no response carries a body. */
  constructor(res: HttpResponse, head: boolean) {
    super();
    this.#res = res;
    this.#head = head;
    res.onAborted(() => this.clientGone());
  }

  pause(): void {
    if (this.open) this.#res.pause();
  }

  resume(): void {
    if (this.open) this.#res.resume();
  }

  /** Sends a JSON error reply with the governor headers it carries. */
  sendReply(r: Reply, extra: ReadonlyArray<readonly [string, string]> | null, closeConnection: boolean): void {
    const body = this.startReply(r);
    if (body === null) return;
    this.#res.cork(() => {
      this.#res.writeStatus(statusLine(r.status)).writeHeader('content-type', 'application/json');
      if (r.headers) for (const [k, v] of r.headers) this.#res.writeHeader(k, v);
      if (extra) for (const [k, v] of extra) this.#res.writeHeader(k, v);
      // A reply to HEAD announces its length and sends no body (or the connection would fall out of step).
      if (this.#head) this.#res.endWithoutBody(Buffer.byteLength(body), closeConnection);
      else this.#res.end(body, closeConnection);
    });
  }

  /** Inside a cork (the same one as the first body bytes or the end): the deferred status line and headers, once. */
  #flushHead(): void {
    const headers = this.takePendingHead();
    if (headers === null) return;
    this.#res.writeStatus(statusLine(this.status));
    for (const [k, v] of headers) this.#res.writeHeader(k, v);
  }

  /** Chunked write; false means backpressure built up (the bytes are buffered; wait for onWritable). */
  write(chunk: Uint8Array): boolean {
    if (!this.open) return false;
    let ok = false;
    this.#res.cork(() => {
      this.#flushHead();
      ok = this.#res.write(chunk);
    });
    return ok;
  }

  /** Content-length write: [accepted whole chunk, response complete]. */
  tryEnd(chunk: Uint8Array, total: number): [boolean, boolean] {
    if (!this.open) return [false, false];
    let r: [boolean, boolean] = [false, false];
    this.#res.cork(() => {
      this.#flushHead();
      r = this.#res.tryEnd(chunk, total);
    });
    if (r[1]) this.isEnded = true;
    return r;
  }

  writeOffset(): number {
    return this.open ? this.#res.getWriteOffset() : 0;
  }

  /** Registers the drain handler (one per response; later calls replace it). */
  onWritable(handler: (offset: number) => boolean): void {
    if (!this.open) return;
    if (this.#writable === null) this.#res.onWritable((offset) => (this.#writable ? this.#writable(offset) : true));
    this.#writable = handler;
  }

  end(): void {
    if (!this.open) return;
    this.isEnded = true;
    this.#res.cork(() => {
      this.#flushHead();
      this.#res.end();
    });
  }

  /** Ends a response that has no body (HEAD, 204, 304), reporting the length a GET would have had. */
  endWithoutBody(reportedLength: number | undefined): void {
    if (!this.open) return;
    this.isEnded = true;
    // The binding turns an explicit undefined into a huge Content-Length: call it without the argument.
    this.#res.cork(() => {
      this.#flushHead();
      if (reportedLength === undefined) this.#res.endWithoutBody();
      else this.#res.endWithoutBody(reportedLength);
    });
  }

  /** Drops the connection: the only honest signal once a response is under way and cannot complete. */
  close(): void {
    if (this.closing()) this.#res.close();
  }
}
