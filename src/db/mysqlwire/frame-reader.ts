// Cuts a byte stream into whole MySQL packets (3-byte length, sequence id, payload). A payload of 16 MiB or
// more arrives split, as the protocol does it (pieces of 0xFFFFFF bytes, then a shorter one): the pieces are
// joined into one packet. At most one packet of at most `maxPayload` bytes is held; a longer one is refused
// as soon as its size is known, never buffered.
import { MAX_PAYLOAD } from './packets.js';

export interface Packet {
  seq: number;
  payload: Buffer;
}

export class FrameReader {
  #maxPayload: number;
  /** Bytes received and not yet cut, as they came (joined once per packet, never per read). */
  #parts: Buffer[] = [];
  #have = 0;
  /** Pieces of a split packet so far. */
  #split: Buffer[] = [];
  #splitBytes = 0;
  #splitSeq = 0;
  /** A packet over the limit was announced: the stream cannot be trusted any more. */
  oversized = false;

  constructor(maxPayload: number) {
    this.#maxPayload = maxPayload;
  }

  /** Changes the largest packet accepted from now on (login packets are small; commands may be large). */
  set limit(maxPayload: number) {
    this.#maxPayload = maxPayload;
  }

  push(chunk: Buffer): void {
    if (chunk.length === 0) return;
    this.#parts.push(chunk);
    this.#have += chunk.length;
  }

  /** The next whole packet, or null when more bytes are needed (or the stream is oversized). */
  next(): Packet | null {
    for (;;) {
      if (this.#have < 4 || this.oversized) return null;
      if (this.#parts[0]!.length < 4) this.#join();
      const head = this.#parts[0]!;
      const len = head.readUIntLE(0, 3);
      if (this.#splitBytes + len > this.#maxPayload) {
        this.oversized = true;
        this.#parts = [];
        this.#have = 0;
        this.#split = [];
        return null;
      }
      if (this.#have < 4 + len) return null;
      if (head.length < 4 + len) this.#join();
      const b = this.#parts[0]!;
      const seq = b[3]!;
      const payload = b.subarray(4, 4 + len);
      if (b.length === 4 + len) this.#parts.shift();
      else this.#parts[0] = b.subarray(4 + len);
      this.#have -= 4 + len;
      if (len === MAX_PAYLOAD) {
        if (this.#split.length === 0) this.#splitSeq = seq;
        this.#split.push(payload);
        this.#splitBytes += len;
        continue;
      }
      if (this.#split.length === 0) return { seq, payload };
      const whole = Buffer.concat([...this.#split, payload]);
      const first = this.#splitSeq;
      this.#split = [];
      this.#splitBytes = 0;
      return { seq: first, payload: whole };
    }
  }

  #join(): void {
    this.#parts = [Buffer.concat(this.#parts)];
  }

  /** Bytes received but not yet cut into packets. */
  get buffered(): number {
    return this.#have + this.#splitBytes;
  }

  /** Takes the unread bytes (a TLS upgrade hands them over). */
  drain(): Buffer | null {
    if (this.#have === 0) return null;
    const b = Buffer.concat(this.#parts);
    this.#parts = [];
    this.#have = 0;
    return b;
  }
}
