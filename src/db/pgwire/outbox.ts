// Frames bound for one socket, written as one write per received chunk: consecutive frames that sit side
// by side in the chunk they arrived in are kept as one view of it (no copy); separate pieces (a rewritten
// frame, a message of our own) are joined at the flush, so each chunk costs one syscall.

export class Outbox {
  readonly #write: (bytes: Buffer) => boolean;
  /** Pieces gathered; the last one may still grow over the chunk it views. */
  readonly #pieces: Buffer[] = [];
  #buf: ArrayBufferLike | null = null;
  #start = 0;
  #end = 0;
  #single: Buffer | null = null;

  constructor(write: (bytes: Buffer) => boolean) {
    this.#write = write;
  }

  add(frame: Buffer): void {
    if (this.#buf === frame.buffer && this.#end === frame.byteOffset) {
      this.#end += frame.length;
      this.#single = null;
      return;
    }
    this.#close();
    this.#buf = frame.buffer;
    this.#start = frame.byteOffset;
    this.#end = frame.byteOffset + frame.length;
    this.#single = frame;
  }

  /** Ends the current run as a piece. */
  #close(): void {
    if (this.#buf === null) return;
    this.#pieces.push(this.#single ?? Buffer.from(this.#buf, this.#start, this.#end - this.#start));
    this.#buf = null;
    this.#single = null;
  }

  /** Writes what is gathered; false when the socket asks to wait for 'drain'. */
  flush(): boolean {
    this.#close();
    const n = this.#pieces.length;
    if (n === 0) return true;
    // pop(), not `length = 0`, for the usual single piece: setting an array's length is a runtime call.
    let bytes: Buffer;
    if (n === 1) bytes = this.#pieces.pop()!;
    else {
      bytes = Buffer.concat(this.#pieces);
      this.#pieces.length = 0;
    }
    return this.#write(bytes);
  }

  /** Forgets what is gathered (the socket it was for is gone). */
  clear(): void {
    this.#buf = null;
    this.#single = null;
    this.#pieces.length = 0;
  }
}
