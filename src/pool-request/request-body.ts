// The client's request body as a Readable with backpressure: uWS is paused whenever the stream's buffer
// is full (the origin or the queue is not reading) and resumed when undici reads again.
import { Readable } from 'node:stream';
import { BodyTooLargeError, type BodyLimit } from './body-limit.js';
import type { ClientSide as ClientResponse } from './client-response.js';
import type { BodySource } from './exchange.js';

export class RequestBody extends Readable {
  readonly #client: ClientResponse;
  readonly #limit: BodyLimit | null;
  #received = 0;
  #paused = false;
  #complete = false;

  /** `limit` null means no limit. Must be constructed synchronously in the uWS handler. */
  constructor(client: ClientResponse, onData: BodySource, limit: BodyLimit | null) {
    super({ highWaterMark: 256 * 1024 });
    this.#client = client;
    this.#limit = limit;
    onData((chunk, isLast) => this.#onChunk(chunk, isLast));
  }

  /** Every byte of the body has arrived from the client. */
  get complete(): boolean {
    return this.#complete;
  }

  #onChunk(chunk: ArrayBuffer, isLast: boolean): void {
    if (this.destroyed) return;
    if (chunk.byteLength > 0) {
      this.#received += chunk.byteLength;
      if (this.#limit !== null && this.#limit.over(this.#received)) {
        this.destroy(new BodyTooLargeError(this.#limit));
        return;
      }
      // uWS neuters the ArrayBuffer when this callback returns: copy it.
      if (!this.push(Buffer.from(chunk.slice(0))) && !isLast) {
        this.#paused = true;
        this.#client.pause();
      }
    }
    if (isLast) {
      this.#complete = true;
      this.push(null);
    }
  }

  override _read(): void {
    if (this.#paused) {
      this.#paused = false;
      this.#client.resume();
    }
  }

  /** Lets uWS read (and discard) the rest of the body, e.g. after a refusal. */
  release(): void {
    if (this.#paused) {
      this.#paused = false;
      this.#client.resume();
    }
  }
}
