// The core's ResponseEncoder over a uWebSockets.js response (the `uws` front door's adapter): every write is
// corked, nothing touches the uWS response after it was aborted or ended (both forbidden by uWS), and the part of
// a Content-Length chunk uWS could not take yet is kept here and written as the socket drains, so the core sees
// the same contract as over node:http (a chunk is always taken whole).
import { STATUS_CODES } from 'node:http';
import type { HttpResponse } from 'uWebSockets.js';
import type { Reply } from '../../pool-request/exchange.js';
import { ClientState, type HeaderList, type ResponseEncoder } from '../../pool-request/codec.js';

const statusLines = new Map<number, string>();
function statusLine(status: number): string {
  let line = statusLines.get(status);
  if (line === undefined) {
    line = `${status} ${STATUS_CODES[status] ?? 'Unknown'}`;
    statusLines.set(status, line);
  }
  return line;
}

export class UwsResponseEncoder extends ClientState implements ResponseEncoder {
  readonly #res: HttpResponse;
  readonly #head: boolean;
  #writable: (() => void) | null = null;
  #drainRegistered = false;
  /** A Content-Length chunk uWS did not take whole, and the write offset it started at. */
  #pending: Buffer | null = null;
  #pendingAt = 0;

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

  sendReply(r: Reply, extra: HeaderList | null, closeConnection: boolean): void {
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
    if (this.headIsFlat) {
      const flat = headers as string[];
      for (let i = 0; i < flat.length; i += 2) this.#res.writeHeader(flat[i]!, flat[i + 1]!);
    } else {
      for (const [k, v] of headers as HeaderList) this.#res.writeHeader(k, v);
    }
  }

  encodeData(chunk: Buffer, end: boolean): boolean {
    if (!this.open) return false;
    const res = this.#res;
    const total = this.headLength;
    let ok = true;
    res.cork(() => {
      this.#flushHead();
      if (total === null) {
        // Chunked (uWS sends a Content-Length itself when end() comes before any write).
        if (end) res.end(chunk);
        else ok = res.write(chunk);
        return;
      }
      const at = res.getWriteOffset();
      const [accepted, done] = res.tryEnd(chunk, total);
      if (done) this.isEnded = true;
      else if (!accepted) {
        this.#pending = chunk;
        this.#pendingAt = at;
        this.#watchDrain();
        ok = false;
      }
    });
    // The caller writes nothing more after `end`; bytes still pending go out as the socket drains.
    if (end) this.isEnded = true;
    return ok;
  }

  onWritable(handler: () => void): void {
    if (!this.open) return;
    this.#writable = handler;
    this.#watchDrain();
  }

  /** One uWS drain handler per response: first the pending chunk's rest, then the caller's handler. */
  #watchDrain(): void {
    if (this.#drainRegistered) return;
    this.#drainRegistered = true;
    this.#res.onWritable((offset) => {
      if (this.isAborted) return true;
      const pending = this.#pending;
      if (pending !== null) {
        const [accepted, done] = this.#res.tryEnd(pending.subarray(offset - this.#pendingAt), this.headLength!);
        if (!accepted && !done) return false;
        this.#pending = null;
      }
      if (!this.isEnded) this.#writable?.();
      return true;
    });
  }

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

  close(): void {
    if (this.closing()) this.#res.close();
  }
}
