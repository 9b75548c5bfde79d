// Frames bound for one socket, written as one write per received chunk. Frames passed on unchanged are byte
// ranges of the chunk they arrived in (frames.ts); consecutive ranges of one chunk are kept as one run, and a
// run that covers the whole chunk is written as the chunk itself, so a chunk that passes through unchanged
// (most answers: RowDescription, DataRows, CommandComplete, ReadyForQuery) costs no Buffer and no copy.
// Separate pieces (a rewritten frame, a message of our own) are joined at the flush: one syscall per chunk.

export class Outbox {
  readonly #write: (bytes: Buffer) => boolean;
  /** Pieces gathered before the current run. */
  readonly #pieces: Buffer[] = [];
  /** The run being gathered: bytes [#start, #end) of #buf; #buf null when none. */
  #buf: Buffer | null = null;
  #start = 0;
  #end = 0;

  constructor(write: (bytes: Buffer) => boolean) {
    this.#write = write;
  }

  /** Bytes [start, end) of `buf`, which is never written again (a received chunk, or a frame of its own). */
  addRange(buf: Buffer, start: number, end: number): void {
    // Identity of the chunk, not of its ArrayBuffer: reading a view's `.buffer` is a call into the runtime.
    if (this.#buf === buf && this.#end === start) {
      this.#end = end;
      return;
    }
    this.#close();
    this.#buf = buf;
    this.#start = start;
    this.#end = end;
  }

  /** A whole Buffer (a message of our own, a rewritten frame). */
  add(bytes: Buffer): void {
    this.addRange(bytes, 0, bytes.length);
  }

  /** Ends the current run as a piece. */
  #close(): void {
    const buf = this.#buf;
    if (buf === null) return;
    this.#pieces.push(this.#start === 0 && this.#end === buf.length ? buf : buf.subarray(this.#start, this.#end));
    this.#buf = null;
  }

  /** Writes what is gathered; false when the socket asks to wait for 'drain'. */
  flush(): boolean {
    const n = this.#pieces.length;
    const buf = this.#buf;
    if (n === 0) {
      // The usual case: one run (often the whole chunk), written without an array.
      if (buf === null) return true;
      this.#buf = null;
      return this.#write(this.#start === 0 && this.#end === buf.length ? buf : buf.subarray(this.#start, this.#end));
    }
    this.#close();
    const bytes = Buffer.concat(this.#pieces);
    this.#pieces.length = 0;
    return this.#write(bytes);
  }

  /** Forgets what is gathered (the socket it was for is gone). */
  clear(): void {
    this.#buf = null;
    if (this.#pieces.length !== 0) this.#pieces.length = 0;
  }
}
