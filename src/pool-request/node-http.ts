// node:http, the core's first-class front door (issue 29 §2): the ResponseEncoder over a ServerResponse, the
// BodySource over an IncomingMessage (its Buffers handed on as they come, no copy) and the request's header
// record. The proxy port, the lock API and job polling all read requests through it. node:http answers
// pipelined requests in order, HTTP/1.0, and malformed requests itself (docs/http-front-door.md).
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Reply } from './exchange.js';
import { ClientState, EMPTY, type BodySource, type HeaderList, type ResponseEncoder } from './codec.js';

export class NodeResponseEncoder extends ClientState implements ResponseEncoder {
  readonly #req: IncomingMessage;
  readonly #res: ServerResponse;
  readonly #head: boolean;
  #writable: (() => void) | null = null;
  #drainWatched = false;

  /**
   * `closeCalled`: the caller already listens to the response's 'close' and calls nodeResponseClosed(res) from it
   * (the proxy port's pipelining listener), so the response keeps one listener; otherwise one is added here. Either
   * way one function serves every response, which finds its encoder on the response (no closure per request).
   */
  constructor(req: IncomingMessage, res: ServerResponse, head: boolean, closeCalled = false) {
    super();
    this.#req = req;
    this.#res = res;
    this.#head = head;
    (res as EncodedResponse)[ENCODER] = this;
    if (!closeCalled) res.on('close', onResponseClose);
  }

  /** The response closed: finished, or cut before its end (then the client is gone). */
  responseClosed(): void {
    if (this.isEnded && this.#res.writableFinished) return;
    this.clientGone();
  }

  pause(): void {
    if (this.open) this.#req.pause();
  }

  resume(): void {
    if (this.open) this.#req.resume();
  }

  sendReply(r: Reply, extra: HeaderList | null, closeConnection: boolean): void {
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

  #flushHead(length: number | null): void {
    const headers = this.takePendingHead();
    if (headers === null) return;
    let flat: string[];
    if (this.headIsFlat) flat = headers as string[];
    else {
      flat = [];
      for (const [k, v] of headers as HeaderList) flat.push(k, v);
    }
    if (length !== null) flat.push('content-length', String(length));
    this.#res.writeHead(this.status, flat);
  }

  encodeData(chunk: Buffer, end: boolean): boolean {
    if (!this.open) return false;
    this.#flushHead(this.headLength);
    if (end) {
      this.isEnded = true;
      this.#res.end(chunk.length > 0 ? chunk : undefined);
      return true;
    }
    const ok = this.#res.write(chunk);
    // 'drain' comes only after a write that returned false: listened to from the first one (most responses never
    // back up, and then cost no listener).
    if (!ok && !this.#drainWatched) {
      this.#drainWatched = true;
      this.#res.on('drain', () => this.#writable?.());
    }
    return ok;
  }

  onWritable(handler: () => void): void {
    if (!this.open) return;
    this.#writable = handler;
  }

  endWithoutBody(reportedLength: number | undefined): void {
    if (!this.open) return;
    this.isEnded = true;
    this.#flushHead(reportedLength ?? null);
    this.#res.end();
  }

  close(): void {
    if (this.closing()) this.#res.destroy();
  }
}

/** Where a response's 'close' listener finds the response's encoder. */
const ENCODER = Symbol('NodeResponseEncoder');
type EncodedResponse = ServerResponse & { [ENCODER]?: NodeResponseEncoder };

/** The 'close' listener of every response whose encoder listens itself. */
function onResponseClose(this: ServerResponse): void {
  nodeResponseClosed(this);
}

/** Tells the response's encoder (if it has one) that the response closed: for a caller that listens to 'close' itself. */
export function nodeResponseClosed(res: ServerResponse): void {
  (res as EncodedResponse)[ENCODER]?.responseClosed();
}

/**
 * The body of a node:http request as the core reads it: node's own Buffers, handed on as they come. With
 * `expectContinue`, 100 Continue goes out once the body is wanted (after the gates).
 */
export function nodeBodySource(req: IncomingMessage, res: ServerResponse, expectContinue: boolean): BodySource {
  let continued = !expectContinue;
  return (h) => {
    if (!continued) {
      continued = true;
      res.writeContinue();
    }
    req.on('data', (b: Buffer) => h(b, false));
    req.on('end', () => h(EMPTY, true));
  };
}

/**
 * The request's headers (lower-case names; repeated headers joined with ", ") from `req.rawHeaders` (names as
 * sent, values in order). Built without a prototype: names known only at run time added to a `{}` one by one each
 * take V8's slow path (a map transition through the runtime, from a megamorphic store site), which callgrind
 * counted at several thousand instructions per request; a prototype-less record takes them as dictionary entries
 * in the store's fast path. Read a header whose name comes from configuration with headerValue().
 */
export function readNodeHeaders(raw: readonly string[]): Record<string, string> {
  const headers = Object.create(null) as Record<string, string>;
  for (let i = 0; i < raw.length; i += 2) {
    const k = lowerName(raw[i]!);
    // No prototype, values all strings: a plain read says whether the name was seen (no Object.hasOwn call per header).
    const seen = headers[k];
    headers[k] = seen === undefined ? raw[i + 1]! : `${seen}, ${raw[i + 1]}`;
  }
  return headers;
}

/** Header names as sent and lower-cased: the same few names come on every request (bounded: names are the client's). */
const LOWER_NAMES = new Map<string, string>();
const MAX_LOWER_NAMES = 512;

/** A header name lower-cased: a map hit costs less than String#toLowerCase (about 1,000 instructions a name). */
function lowerName(name: string): string {
  let lower = LOWER_NAMES.get(name);
  if (lower === undefined) {
    lower = name.toLowerCase();
    if (LOWER_NAMES.size < MAX_LOWER_NAMES) LOWER_NAMES.set(name, lower);
  }
  return lower;
}
