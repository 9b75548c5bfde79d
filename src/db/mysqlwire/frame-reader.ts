// Cuts a byte stream into whole MySQL packets (3-byte length, sequence id, payload), holding at most one
// packet of at most `maxPayload` bytes: a longer (or split, 16 MiB) packet is refused, never buffered.
import { MAX_PAYLOAD } from './packets.js';

export interface Packet {
  seq: number;
  payload: Buffer;
}

export class FrameReader {
  #maxPayload: number;
  #buf: Buffer | null = null;
  /** A packet over the limit was announced: the stream cannot be trusted any more. */
  oversized = false;

  constructor(maxPayload: number) {
    this.#maxPayload = Math.min(maxPayload, MAX_PAYLOAD - 1);
  }

  /** Changes the largest packet accepted from now on (login packets are small; commands may be large). */
  set limit(maxPayload: number) {
    this.#maxPayload = Math.min(maxPayload, MAX_PAYLOAD - 1);
  }

  push(chunk: Buffer): void {
    this.#buf = this.#buf === null || this.#buf.length === 0 ? chunk : Buffer.concat([this.#buf, chunk]);
  }

  /** The next whole packet, or null when more bytes are needed (or the stream is oversized). */
  next(): Packet | null {
    const b = this.#buf;
    if (b === null || b.length < 4 || this.oversized) return null;
    const len = b.readUIntLE(0, 3);
    if (len > this.#maxPayload) {
      this.oversized = true;
      this.#buf = null;
      return null;
    }
    if (b.length < 4 + len) return null;
    const payload = b.subarray(4, 4 + len);
    const seq = b[3]!;
    this.#buf = b.length === 4 + len ? null : b.subarray(4 + len);
    return { seq, payload };
  }

  /** Bytes received but not yet cut into packets. */
  get buffered(): number {
    return this.#buf?.length ?? 0;
  }

  /** Takes the unread bytes (a TLS upgrade hands them over). */
  drain(): Buffer | null {
    const b = this.#buf;
    this.#buf = null;
    return b;
  }
}
