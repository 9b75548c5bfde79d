// Frames bound for one socket, written as one write per received chunk. Frames passed on unchanged are byte
// ranges of the chunk they arrived in (frames.ts); consecutive ranges of one chunk are kept as one run, and a
// run that covers the whole chunk is written as the chunk itself, so a chunk that passes through unchanged
// (most answers: RowDescription, DataRows, CommandComplete, ReadyForQuery) costs no Buffer and no copy.
// A frame of our own that is written per transaction (a renamed Bind) is written straight into the outbox's
// own memory (reserve()), and the short frames around it in the chunk are copied after it, so the batch is
// still one run: one view, no Buffer.concat. Other separate pieces (a message of our own, a long range after
// a rewritten frame) are joined at the flush: one syscall per chunk either way.

/** The outbox's own memory, carved frame by frame like the read slabs: a region handed out is never written again. */
const SCRATCH = 4 * 1024;
/** A range this short is copied into the own memory after a frame written there (a Describe, Execute, Sync). */
const COPY_MAX = 256;

export class Outbox {
  readonly #write: (bytes: Buffer) => boolean;
  /** Pieces gathered before the current run. */
  readonly #pieces: Buffer[] = [];
  /** The run being gathered: bytes [#start, #end) of #buf; #buf null when none. */
  #buf: Buffer | null = null;
  #start = 0;
  #end = 0;
  /** Own memory (null until a frame is first written here), and where its free part starts. */
  #scratch: Buffer | null = null;
  #scratchAt = 0;

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
    // After a frame written in our own memory: a short frame is copied behind it, keeping one run.
    const scratch = this.#scratch;
    const n = end - start;
    if (scratch !== null && this.#buf === scratch && this.#end === this.#scratchAt && n <= COPY_MAX && this.#scratchAt + n <= SCRATCH) {
      let at = this.#scratchAt;
      for (let i = start; i < end; i++) scratch[at++] = buf[i]!;
      this.#scratchAt = at;
      this.#end = at;
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

  /**
   * Room for a frame of `n` bytes that the caller writes now, at the returned offset of `scratch`; it is
   * added to the outbox as it stands (the caller must fill every byte before anything else is added).
   */
  reserve(n: number): number {
    if (n > SCRATCH / 2) {
      // A large frame (a Bind with large parameters): memory of its own, as a piece.
      this.#close();
      const own = Buffer.allocUnsafe(n);
      this.#buf = own;
      this.#start = 0;
      this.#end = n;
      this.#reserved = own;
      return 0;
    }
    let scratch = this.#scratch;
    // A short run of the chunk just before it is copied in first, so the batch stays one run.
    const prior = this.#buf !== null && this.#buf !== scratch && this.#end - this.#start <= COPY_MAX ? this.#end - this.#start : 0;
    if (scratch === null || this.#scratchAt + prior + n > SCRATCH) {
      // The frames of the old memory still in the run (if any) become a piece; the run starts again.
      if (this.#buf === scratch) this.#close();
      scratch = this.#scratch = Buffer.allocUnsafeSlow(SCRATCH);
      this.#scratchAt = 0;
    }
    this.#reserved = scratch;
    if (this.#buf === scratch && this.#end === this.#scratchAt) {
      const at = this.#scratchAt;
      this.#scratchAt = this.#end = at + n;
      return at;
    }
    let at = this.#scratchAt;
    let start = at;
    if (prior !== 0) {
      const buf = this.#buf!;
      for (let i = this.#start; i < this.#end; i++) scratch[at++] = buf[i]!;
      start = this.#scratchAt;
      this.#buf = null;
    } else this.#close();
    this.#buf = scratch;
    this.#start = start;
    this.#end = at + n;
    this.#scratchAt = at + n;
    return at;
  }

  /** The memory the last reserve() handed out. */
  get reserved(): Buffer {
    return this.#reserved!;
  }

  #reserved: Buffer | null = null;

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
