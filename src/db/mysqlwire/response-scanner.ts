// Finds where a server's answer to one command ends while its bytes stream through untouched: it reads
// the 4-byte header and at most the first 24 payload bytes of each packet, and follows the response
// grammar (OK / ERR / result sets with classic EOF packets, multi-results, prepare answers).
// A packet that lies whole in one chunk (nearly all: rows are small, and a read brings many) is read where
// it lies; only one cut by a chunk's end is gathered into #hdr and #peek. Copying every packet's header and
// head out first cost two Buffer copies per row: ~600 per sysbench oltp_read_only transaction.
import { STATUS, okStatus } from './packets.js';

/** `result`: COM_QUERY / COM_STMT_EXECUTE; `single`: one packet (ping, reset, init db, set option); `fields`: COM_FIELD_LIST. */
export type ResponseKind = 'result' | 'single' | 'fields' | 'prepare';

const PEEK = 24;
const SPLIT = 0xffffff;

/** The 2-byte integer at b[i] (callers check the packet is long enough). */
const u16 = (b: Buffer, i: number): number => b[i]! | (b[i + 1]! << 8);

type State = 'first' | 'cols' | 'coleof' | 'rows' | 'defs' | 'defeof';

export class ResponseScanner {
  #kind: ResponseKind = 'single';
  #state: State = 'first';
  #count = 0;
  /** Prepare answers: the definition blocks still to come (params, then columns). */
  #sections: number[] = [];
  readonly #hdr = Buffer.alloc(4);
  #hdrHave = 0;
  #inPayload = false;
  #len = 0;
  #remaining = 0;
  readonly #peek = Buffer.alloc(PEEK);
  #peekHave = 0;
  #continued = false;
  /** The server status flags last seen (ERR packets carry none: the previous flags stand, so start() takes them). */
  status = 0;
  /** The answer ended with an ERR packet. */
  error = false;
  /** The answer paused at a LOCAL INFILE request: the client's file comes next, then resume(). */
  fileRequest = false;
  /** LOCAL INFILE requests are followed (a COM_QUERY from a client that announced CLIENT_LOCAL_FILES). */
  #localFiles = false;

  /**
   * `status`: the connection's flags before the command. An answer that is only an ERR carries none, and
   * they stand; starting from 0 instead would read as "autocommit off, in a transaction" and keep the
   * connection with the client (an error as the first answer on a new connection).
   */
  start(kind: ResponseKind, status: number, localFiles = false): void {
    this.#kind = kind;
    this.#localFiles = localFiles;
    this.fileRequest = false;
    this.status = status;
    this.#state = kind === 'fields' ? 'defs' : 'first';
    this.#count = 0;
    // Only prepare answers fill it; a new list then (setting .length goes through V8's runtime: dearer than one).
    if (this.#sections.length !== 0) this.#sections = [];
    this.error = false;
    this.#hdrHave = 0;
    this.#inPayload = false;
    this.#continued = false;
  }

  /** After a LOCAL INFILE request and the client's file: the server's OK or ERR (maybe more results) comes next. */
  resume(): void {
    this.fileRequest = false;
  }

  /** Feeds bytes from `at`; returns the offset just after the answer's last byte, or -1 when it has not ended. */
  feed(chunk: Buffer, at: number): number {
    while (at < chunk.length) {
      if (!this.#inPayload && this.#hdrHave === 0 && chunk.length - at >= 4) {
        const len = chunk[at]! | (chunk[at + 1]! << 8) | (chunk[at + 2]! << 16);
        if (chunk.length - at - 4 >= len) {
          this.#len = len;
          at += 4 + len;
          if (this.#packet(chunk, at - len, Math.min(len, PEEK))) return at;
          continue;
        }
      }
      if (!this.#inPayload) {
        const n = Math.min(4 - this.#hdrHave, chunk.length - at);
        chunk.copy(this.#hdr, this.#hdrHave, at, at + n);
        this.#hdrHave += n;
        at += n;
        if (this.#hdrHave < 4) return -1;
        this.#len = this.#hdr.readUIntLE(0, 3);
        this.#remaining = this.#len;
        this.#peekHave = 0;
        this.#inPayload = true;
      }
      const n = Math.min(this.#remaining, chunk.length - at);
      if (this.#peekHave < PEEK && n > 0) {
        const p = Math.min(PEEK - this.#peekHave, n);
        chunk.copy(this.#peek, this.#peekHave, at, at + p);
        this.#peekHave += p;
      }
      at += n;
      this.#remaining -= n;
      if (this.#remaining > 0) return -1;
      this.#inPayload = false;
      this.#hdrHave = 0;
      if (this.#packet(this.#peek, 0, this.#peekHave)) return at;
    }
    return -1;
  }

  /** One whole packet seen (the first `n` bytes of its payload at b[o]: min(length, PEEK)); true when it ends the answer. */
  #packet(b: Buffer, o: number, n: number): boolean {
    const len = this.#len;
    if (this.#continued) {
      // The tail of a packet split at 16 MiB: data, not a new packet.
      this.#continued = len === SPLIT;
      return false;
    }
    this.#continued = len === SPLIT;
    const first = len > 0 ? b[o]! : -1;
    const isEof = first === 0xfe && len < 9;
    if (first === 0xff) {
      this.error = true;
      return true;
    }
    switch (this.#state) {
      case 'first': {
        if (this.#kind === 'single') {
          if (first === 0x00) this.status = okStatus(b.subarray(o, o + n)) ?? this.status;
          else if (isEof && len >= 5) this.status = u16(b, o + 3);
          return true;
        }
        if (this.#kind === 'prepare') {
          if (first !== 0x00 || len < 9) return true;
          const cols = u16(b, o + 5);
          const params = u16(b, o + 7);
          if (params > 0) this.#sections.push(params);
          if (cols > 0) this.#sections.push(cols);
          return this.#nextSection();
        }
        if (first === 0x00) {
          this.status = okStatus(b.subarray(o, o + n)) ?? this.status;
          return (this.status & STATUS.MORE_RESULTS) === 0;
        }
        if (first === 0xfb) {
          // A LOCAL INFILE request ends this part of the answer: the client sends its file, then the server
          // answers on from 'first'. Asked for anything else (or for a client that did not announce
          // CLIENT_LOCAL_FILES), it ends the exchange as an error.
          if (this.#localFiles) this.fileRequest = true;
          else this.error = true;
          return true;
        }
        if (first === 0xfc && n < 3) throw new RangeError('column count packet cut short');
        this.#count = first !== -1 && first < 0xfb ? first : first === 0xfc ? u16(b, o + 1) : 0xffff;
        this.#state = 'cols';
        return false;
      }
      case 'cols':
        if (--this.#count <= 0) this.#state = 'coleof';
        return false;
      case 'coleof':
        if (isEof && len >= 5) this.status = u16(b, o + 3);
        if ((this.status & STATUS.CURSOR_EXISTS) !== 0) return true;
        this.#state = 'rows';
        return false;
      case 'rows':
        if (!isEof) return false;
        if (len >= 5) this.status = u16(b, o + 3);
        if ((this.status & STATUS.MORE_RESULTS) !== 0) {
          this.#state = 'first';
          return false;
        }
        return true;
      case 'defs':
        if (this.#kind === 'fields') return isEof;
        if (--this.#count <= 0) this.#state = 'defeof';
        return false;
      case 'defeof':
        return this.#nextSection();
    }
  }

  #nextSection(): boolean {
    const n = this.#sections.shift();
    if (n === undefined) return true;
    this.#count = n;
    this.#state = 'defs';
    return false;
  }
}
