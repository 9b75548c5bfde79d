// The PostgreSQL frame reader for both directions: a type byte and an int32 length (or, for the very first
// client packet, only the length). Whole frames are handed out as a byte range of the received chunk when they
// fit in it, as PgBouncer reads only the headers: no Buffer is made per frame, and frames passed on unchanged
// are written as the chunk itself (outbox.ts). A frame split over chunks is assembled once, never re-grown.

/** A frame refused before it was buffered: its declared length is impossible or over the limit. */
export interface FrameError {
  kind: 'too_large' | 'bad_length';
  declared: number;
}

/** One whole frame: bytes [start, end) of `buf` (header included). `buf` is never written again: it may be kept. */
export type FrameSink = (type: number, buf: Buffer, start: number, end: number) => void;

/** Type passed for untyped startup-phase packets (StartupMessage, SSLRequest, CancelRequest...). */
export const UNTYPED = 0;

export class FrameReader {
  /** Largest frame accepted (header included); raised after login. */
  maxFrameBytes: number;
  /** Bytes of the frame header still being gathered (at most 5). */
  readonly #head = Buffer.allocUnsafe(5);
  #headLen = 0;
  /** A frame being assembled across chunks, and how much of it is filled. */
  #partial: Buffer | null = null;
  #filled = 0;
  /** The next frame has no type byte (client startup phase). */
  untyped: boolean;

  constructor(maxFrameBytes: number, untyped = false) {
    this.maxFrameBytes = maxFrameBytes;
    this.untyped = untyped;
  }

  /** Bytes held for a frame not yet complete. */
  get buffered(): number {
    return this.#headLen + this.#filled;
  }

  /**
   * Splits a chunk into frames, calling `sink` for each whole frame (header included). Returns an error,
   * and stops, on a frame that may not be read; the reader is then unusable.
   */
  push(chunk: Buffer, sink: FrameSink): FrameError | null {
    let at = 0;
    const end = chunk.length;
    while (at < end) {
      if (this.#partial) {
        const need = this.#partial.length - this.#filled;
        const take = Math.min(need, end - at);
        chunk.copy(this.#partial, this.#filled, at, at + take);
        this.#filled += take;
        at += take;
        if (this.#filled < this.#partial.length) return null;
        const frame = this.#partial;
        this.#partial = null;
        this.#filled = 0;
        this.#deliver(frame, 0, frame.length, sink);
        continue;
      }
      const headSize = this.untyped ? 4 : 5;
      let header: Buffer;
      let headerAt: number;
      if (this.#headLen === 0 && end - at >= headSize) {
        header = chunk;
        headerAt = at;
      } else {
        const take = Math.min(headSize - this.#headLen, end - at);
        chunk.copy(this.#head, this.#headLen, at, at + take);
        this.#headLen += take;
        at += take;
        if (this.#headLen < headSize) return null;
        header = this.#head;
        headerAt = 0;
      }
      const typeBytes = headSize - 4;
      const length = header.readInt32BE(headerAt + typeBytes);
      if (length < 4) return { kind: 'bad_length', declared: length };
      const total = typeBytes + length;
      if (total > this.maxFrameBytes) return { kind: 'too_large', declared: length };
      if (header === chunk) {
        if (end - at >= total) {
          at += total;
          this.#deliver(chunk, at - total, at, sink);
          continue;
        }
        // Split over chunks: one buffer of the final size, filled as bytes come.
        this.#partial = Buffer.allocUnsafe(total);
        this.#filled = 0;
        continue;
      }
      // The header came in pieces: start the frame with it.
      this.#headLen = 0;
      this.#partial = Buffer.allocUnsafe(total);
      this.#head.copy(this.#partial, 0, 0, headSize);
      this.#filled = headSize;
      if (this.#filled === total) {
        const frame = this.#partial;
        this.#partial = null;
        this.#filled = 0;
        this.#deliver(frame, 0, total, sink);
      }
    }
    return null;
  }

  #deliver(buf: Buffer, start: number, end: number, sink: FrameSink): void {
    if (this.untyped) sink(UNTYPED, buf, start, end);
    else sink(buf[start]!, buf, start, end);
  }
}

/** Reads a NUL-terminated string at `at`; returns it and the offset after the NUL, or null when unterminated. */
export function cstring(buf: Buffer, at: number, end = buf.length): { value: string; next: number } | null {
  const nul = buf.indexOf(0, at);
  if (nul < 0 || nul >= end) return null;
  return { value: buf.toString('utf8', at, nul), next: nul + 1 };
}
