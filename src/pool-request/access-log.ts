// The pool access log: one JSON line per request, in pino's format, on pino's buffered (async) destination,
// so writing it never waits on the disk; successful requests can be sampled, refusals and errors never are.
import { pino } from 'pino';
import type { OutcomeName } from './exchange.js';
import { NODE_TIMERS, type GovernorTimers } from '../governor/clock.js';

type Destination = ReturnType<typeof pino.destination>;

/**
 * Gathers lines and hands them to the destination in few, large writes: at the end of an event-loop turn once
 * `holdChars` are gathered, else within HOLD_MS. SonicBoom measures the UTF-8 length of its last pending chunk on
 * every write (flattening it): one write per request cost more than formatting the line (pino's write was 8.5% of
 * the data plane's CPU under load, bench/RESULTS.md "Proxy"), and with its own `minLength` buffering a quiet pool's
 * lines waited for 4 KB, however long that took, and each small write flattened all of them again.
 */
class LineBatch {
  readonly #dest: Destination;
  readonly #holdChars: number;
  readonly #timers: GovernorTimers;
  readonly #lines: string[] = [];
  #chars = 0;
  #turnScheduled = false;
  #timer: unknown = null;
  /** The destination is closing or closed: a write to it would throw, and from an immediate nothing catches it. */
  #ended = false;

  constructor(dest: Destination, holdChars: number, timers: GovernorTimers) {
    this.#dest = dest;
    this.#holdChars = holdChars;
    this.#timers = timers;
  }

  write(line: string): void {
    // A request cut at shutdown (past the drain time) settles after the log closed: its line has nowhere to go.
    if (this.#ended) return;
    this.#lines.push(line);
    this.#chars += line.length;
    if (this.#lines.length >= MAX_BATCH_LINES) this.flush();
    else if (!this.#turnScheduled) {
      this.#turnScheduled = true;
      setImmediate(this.#onTurnEnd);
    }
  }

  readonly #onTurnEnd = (): void => {
    this.#turnScheduled = false;
    if (this.#chars >= this.#holdChars) this.flush();
    else if (this.#timer === null && this.#lines.length > 0) {
      this.#timer = this.#timers.setTimeout(this.#onHeldLong, HOLD_MS, null);
      // Node's timer must not keep the process alive; a test's driven timer has no unref.
      (this.#timer as { unref?: () => void }).unref?.();
    }
  };

  readonly #onHeldLong = (): void => {
    this.#timer = null;
    this.flush();
  };

  /** Hands what is gathered to the destination now, and takes no more lines. */
  end(): void {
    this.flush();
    this.#ended = true;
  }

  /** Hands what is gathered to the destination now. */
  flush(): void {
    if (this.#ended) return;
    if (this.#timer !== null) {
      this.#timers.clearTimeout(this.#timer);
      this.#timer = null;
    }
    const n = this.#lines.length;
    if (n === 0) return;
    this.#dest.write(n === 1 ? this.#lines[0]! : this.#lines.join(''));
    this.#lines.length = 0;
    this.#chars = 0;
  }
}

const MAX_BATCH_LINES = 256;
/** A file gets lines in writes of at least this many characters, unless they have waited HOLD_MS. */
const FILE_HOLD_CHARS = 4096;
/** The longest a line waits before it is handed to the destination. */
const HOLD_MS = 1000;

let stampedAt = -1;
let stamp = '';
/** The ISO time up to the seconds' dot, and the second it is for (Date's toISOString goes through V8's printf). */
let secondAt = -1;
let secondPrefix = '';

/**
 * pino's isoTime, formatted once per millisecond (many requests end in the same one under load), and the date
 * and time of day once per second: within it only the milliseconds change.
 */
function isoTimeOncePerMs(): string {
  const now = Date.now();
  if (now !== stampedAt) {
    stampedAt = now;
    const ms = now % 1000;
    const second = now - ms;
    if (second !== secondAt) {
      secondAt = second;
      secondPrefix = `,"time":"${new Date(second).toISOString().slice(0, 20)}`;
    }
    stamp = `${secondPrefix}${ms < 10 ? '00' : ms < 100 ? '0' : ''}${ms}Z"`;
  }
  return stamp;
}

/** A JSON string, or null. */
const jsonOrNull = (v: string | null): string => (v === null ? 'null' : JSON.stringify(v));

/**
 * A client's string as JSON: quoted as is when no character needs escaping (a path nearly always), else through
 * JSON.stringify. The scan costs a few instructions a character; JSON.stringify's runtime call several hundred.
 */
function jsonString(v: string): string {
  for (let i = 0; i < v.length; i++) {
    const c = v.charCodeAt(i);
    // Control characters, '"', '\\', and everything past ASCII (lone surrogates are escaped by JSON.stringify).
    if (c < 0x20 || c === 0x22 || c === 0x5c || c > 0x7e) return JSON.stringify(v);
  }
  return `"${v}"`;
}

/**
 * The `"pool":…,"method":…` part of the last line, kept while the pool and method stay the same (under load one
 * pool's GETs follow each other): two JSON encodings and their concatenation less per line.
 */
let lastPool: string | null = null;
let lastMethod = '';
let lastPoolMethod = '';

function poolAndMethod(pool: string | null, method: string): string {
  if (pool !== lastPool || method !== lastMethod || lastPoolMethod === '') {
    lastPool = pool;
    lastMethod = method;
    lastPoolMethod = `,"pool":${jsonOrNull(pool)},"method":${jsonString(method)}`;
  }
  return lastPoolMethod;
}
/** A JSON number, or null (as JSON.stringify writes NaN, Infinity and a missing value). */
const num = (v: number | null): number | 'null' => (v !== null && Number.isFinite(v) ? v : 'null');

/**
 * The line pino's `info` would write for the record (level 30, ISO time, `log: "access"`, then the fields in
 * order), formatted directly: the record's shape is fixed, and pino's general serializer cost about three times
 * as much per line, on every request. Strings a client chose (method, path) are quoted as they are when nothing in
 * them needs escaping, else through JSON.stringify (jsonString).
 */
function accessLine(r: AccessRecord): string {
  return (
    `{"level":30${isoTimeOncePerMs()},"log":"access"${poolAndMethod(r.pool, r.method)}` +
    `,"path":${jsonString(r.path)},"status":${num(r.status)},"outcome":"${r.outcome}","queuedMs":${num(r.queuedMs)}` +
    `,"upstreamMs":${num(r.upstreamMs)},"totalMs":${num(r.totalMs)},"keyId":${num(r.keyId)}` +
    (r.detail === undefined ? '}\n' : `,"detail":${JSON.stringify(r.detail)}}\n`)
  );
}

export interface AccessRecord {
  pool: string | null;
  method: string;
  path: string;
  status: number;
  outcome: OutcomeName;
  queuedMs: number;
  upstreamMs: number | null;
  /** From arrival to release. */
  totalMs: number;
  keyId: number | null;
  /** Why the origin failed, when it did: kept here, out of the client's answer. */
  detail?: string;
}

export class AccessLog {
  readonly #destination: Destination;
  readonly #batch: LineBatch;
  readonly #sample: number;
  readonly #toFile: boolean;
  #seen = 0;
  #closing: Promise<void> | null = null;

  /**
   * `file` null writes to stderr; `sample` N logs one successful request in N (0: none); `timers` run the
   * HOLD_MS wait (Node's unless a test drives them).
   */
  constructor(opts: { file: string | null; sample: number; timers?: GovernorTimers }) {
    // The batch does the buffering (SonicBoom's own minLength has no time limit): the destination writes what it is given.
    this.#destination = opts.file ? pino.destination({ dest: opts.file, sync: false, mkdir: true }) : pino.destination({ fd: 2, sync: false });
    // stderr gets each turn's lines at once (a terminal or a container log is read as it happens).
    this.#batch = new LineBatch(this.#destination, opts.file ? FILE_HOLD_CHARS : 0, opts.timers ?? NODE_TIMERS);
    this.#sample = opts.sample;
    this.#toFile = opts.file !== null;
  }

  write(r: AccessRecord): void {
    if ((r.outcome === 'proxied' || r.outcome === 'lease_granted' || r.outcome === 'job_accepted') && r.status < 500) {
      if (this.#sample === 0) return;
      if (this.#sample > 1 && this.#seen++ % this.#sample !== 0) return;
    }
    this.#batch.write(accessLine(r));
  }

  /** Writes everything gathered and buffered; a file destination is closed once it is written. */
  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    this.#batch.end();
    const dest = this.#destination;
    // flush()'s callback comes when the write in flight is done, while later lines may still be buffered; close()
    // once returned with them unwritten (a shutdown could lose the last lines).
    if (this.#toFile) {
      // end() writes everything buffered, then closes the file: 'close' means it is all written.
      await new Promise<void>((resolve) => {
        dest.once('close', () => resolve());
        dest.once('error', () => resolve());
        try {
          dest.end();
        } catch {
          resolve();
        }
      });
      return;
    }
    // stderr stays open: let the write in flight finish, then write the rest synchronously.
    await new Promise<void>((resolve) => dest.flush(() => resolve()));
    try {
      dest.flushSync();
    } catch {
      // Destroyed or not open: nothing more can be written.
    }
  }
}
