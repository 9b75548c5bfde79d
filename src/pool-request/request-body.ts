// The client's request body as a Readable with backpressure: uWS is paused whenever the stream's buffer
// is full (the origin or the queue is not reading) and resumed when undici reads again. The body has an idle
// timeout of its own (issue 25 item 4): a client that declares a body and then goes silent is answered 408
// instead of holding its connection, and its slot, until the request timeout.
import { Readable } from 'node:stream';
import { BodyTooLargeError, type BodyLimit } from './body-limit.js';
import type { BodySource, ResponseEncoder } from './codec.js';
import { reply } from './exchange.js';

/** The client sent no body byte for the body timeout (RequestBody destroys itself with this). */
export class BodyTimeoutError extends Error {
  override name = 'BodyTimeoutError';
  static readonly reply = reply(408, 'request_timeout', 'the request body stopped arriving (POOLGATE_PROXY_BODY_TIMEOUT_MS)');
}

const swallow = (): void => {};

export class RequestBody extends Readable {
  readonly #client: ResponseEncoder;
  readonly #limit: BodyLimit | null;
  readonly #idleMs: number;
  #received = 0;
  #paused = false;
  #complete = false;
  #idle: NodeJS.Timeout | null = null;
  /** whenReceived(): told once `#target` bytes (or all of them) arrived, or the error that ended the body. */
  #waiter: ((err: Error | null) => void) | null = null;
  #target = 0;
  /** Every chunk, kept when the body must be judged whole (a read key's form body: scope.ts). */
  #kept: Buffer[] | null;

  /**
   * `limit` null means no limit; `idleMs` 0 means no body timeout; `keep`: keep the chunks (kept()). Must be
   * constructed synchronously in the uWS handler.
   */
  constructor(client: ResponseEncoder, onData: BodySource, limit: BodyLimit | null, idleMs = 0, keep = false) {
    super({ highWaterMark: 256 * 1024 });
    this.#client = client;
    this.#limit = limit;
    this.#idleMs = idleMs;
    this.#kept = keep ? [] : null;
    // Whoever reads the body learns of its end from `errored` or its own listener; none may be attached yet.
    this.on('error', swallow);
    onData((chunk, isLast) => this.#onChunk(chunk, isLast));
  }

  /** Every byte of the body has arrived from the client. */
  get complete(): boolean {
    return this.#complete;
  }

  /** Bytes arrived so far. */
  get received(): number {
    return this.#received;
  }

  /** The whole body, when it was constructed with `keep` and is complete. */
  kept(): Buffer {
    return Buffer.concat(this.#kept ?? [], this.#received);
  }

  /**
   * Calls `done(null)` once `bytes` of the body, or all of it, have arrived; `done(err)` when the body ends
   * otherwise first (over the limit, idle past the body timeout, destroyed). Starts the body timeout, which
   * then runs until the body is complete.
   */
  whenReceived(bytes: number, done: (err: Error | null) => void): void {
    this.#armIdle();
    if (this.#complete || this.#received >= bytes) return done(null);
    if (this.destroyed) return done(this.errored ?? new Error('the request body was cut'));
    this.#target = bytes;
    this.#waiter = done;
  }

  #armIdle(): void {
    if (this.#idleMs > 0 && this.#idle === null && !this.#complete && !this.destroyed) {
      this.#idle = setTimeout(() => this.#onIdle(), this.#idleMs);
    }
  }

  #onIdle(): void {
    // Paused by us (the origin or the queue is not reading): not the client's silence.
    if (this.#paused) {
      this.#idle?.refresh();
      return;
    }
    this.destroy(new BodyTimeoutError());
  }

  #onChunk(chunk: Buffer, isLast: boolean): void {
    if (this.destroyed) return;
    if (chunk.byteLength > 0) {
      this.#received += chunk.byteLength;
      if (this.#limit !== null && this.#limit.over(this.#received)) {
        this.destroy(new BodyTooLargeError(this.#limit));
        return;
      }
      this.#idle?.refresh();
      // The door handed the chunk over (codec.ts BodySource): kept and streamed as it is.
      this.#kept?.push(chunk);
      if (!this.push(chunk) && !isLast) {
        this.#paused = true;
        this.#client.pause();
      }
    }
    if (isLast) {
      this.#complete = true;
      this.#clearIdle();
      this.push(null);
    }
    const w = this.#waiter;
    if (w !== null && (this.#complete || this.#received >= this.#target)) {
      this.#waiter = null;
      w(null);
    }
  }

  #clearIdle(): void {
    if (this.#idle !== null) clearTimeout(this.#idle);
    this.#idle = null;
  }

  override _read(): void {
    if (this.#paused) {
      this.#paused = false;
      this.#client.resume();
    }
  }

  override _destroy(err: Error | null, callback: (error?: Error | null) => void): void {
    this.#clearIdle();
    const w = this.#waiter;
    this.#waiter = null;
    w?.(err ?? new Error('the request body was cut'));
    callback(err);
  }

  /** Lets uWS read (and discard) the rest of the body, e.g. after a refusal. */
  release(): void {
    this.#clearIdle();
    if (this.#paused) {
      this.#paused = false;
      this.#client.resume();
    }
  }
}
