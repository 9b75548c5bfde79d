// Wire fuzzing harness shared by the PostgreSQL and MySQL listener fuzz tests: a seeded PRNG, frame
// mutators, and a runner that spreads generated frames over a bounded number of TCP connections.
import { connect, type Socket } from 'node:net';

/** mulberry32: tiny, fast and seedable, so every connection's frames can be replayed from the printed seed. */
export class Rng {
  #s: number;
  constructor(seed: number) {
    this.#s = seed >>> 0;
  }
  next(): number {
    let t = (this.#s = (this.#s + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  int(n: number): number {
    return Math.floor(this.next() * n);
  }
  range(lo: number, hi: number): number {
    return lo + this.int(hi - lo + 1);
  }
  chance(p: number): boolean {
    return this.next() < p;
  }
  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)]!;
  }
  bytes(n: number): Buffer {
    const b = Buffer.allocUnsafe(n);
    for (let i = 0; i < n; i++) b[i] = this.int(256);
    return b;
  }
  /** Connection i's generator: the same frames whatever the interleaving, and replayable alone (FUZZ_ONLY=i). */
  static forConnection(seed: number, index: number): Rng {
    const r = new Rng(seed ^ Math.imul(index + 1, 2654435761));
    r.next();
    return r;
  }
}

/** Byte-level damage to an otherwise valid frame: bit flips, truncation, byte overwrites, insertions. */
/** A printable-only change of a query's text: the frame stays well formed, the SQL usually does not. */
export function mutateText(rng: Rng, sql: string): string {
  const chars = [...sql];
  for (let i = 0, n = rng.range(1, 3); i < n && chars.length; i++) {
    const at = rng.int(chars.length);
    chars[at] = String.fromCharCode(0x20 + (((chars[at]!.charCodeAt(0) ^ (1 << rng.int(6))) - 0x20 + 95) % 95));
  }
  return chars.join('');
}

export function mutateBytes(rng: Rng, frame: Buffer): Buffer {
  const b = Buffer.from(frame);
  switch (rng.int(5)) {
    case 0: {
      const flips = rng.range(1, 4);
      for (let i = 0; i < flips && b.length; i++) b[rng.int(b.length)]! ^= 1 << rng.int(8);
      return b;
    }
    case 1:
      return b.subarray(0, rng.int(Math.max(1, b.length)));
    case 2: {
      for (let i = 0; i < rng.range(1, 3) && b.length; i++) b[rng.int(b.length)] = rng.pick([0, 0xff, 0x7f, 0x80, rng.int(256)]);
      return b;
    }
    case 3: {
      const at = rng.int(b.length + 1);
      return Buffer.concat([b.subarray(0, at), rng.bytes(rng.range(1, 16)), b.subarray(at)]);
    }
    default: {
      const at = rng.int(b.length + 1);
      return Buffer.concat([b.subarray(0, at), b.subarray(Math.min(b.length, at + rng.range(1, 8)))]);
    }
  }
}

/** A length that lies about the payload that follows it (for 32-bit signed lengths). */
export function lyingLength(rng: Rng, actual: number): number {
  return rng.pick([0, 1, 3, -1, -2147483648, 2147483647, 0x40000000, 0x7ffffff0, actual - rng.range(1, 8), actual + rng.range(1, 64), actual + 100_000, rng.int(2 ** 31)]);
}

/** One connection's plan: how it opens, then the frames it sends. */
export interface Scenario {
  /** The protocol phase the frames aim at (counted in the summary). */
  phase: string;
  /** Frames whose framing is valid (only the content is wrong): the listener must stay in step and answer the probe. */
  wellFramed: boolean;
  frames: Buffer[];
  /** Runs before the frames (e.g. a login); false when the server refused it (the connection is then closed). */
  prelude?(conn: WireConn): Promise<boolean>;
  /** Sent after the frames of a well-framed scenario; `probed(output)` must then become true. */
  probe?: Buffer;
  /** The client vanishes (socket destroyed, no FIN) after its frames instead of ending cleanly. */
  vanish?: boolean;
}

/** A protocol's frame generators and client steps, from which `mixScenarios` makes each connection's plan. */
export interface Protocol {
  /** Names of the two pre-login phases (e.g. 'startup'/'auth', 'pre-greeting'/'handshake'). */
  phases: { connect: string; auth: string };
  /** A frame aimed at a server that has been sent nothing yet. */
  connectFrame(rng: Rng): Buffer;
  /** Starts a login (and reads what the server asks for); then the frames aimed at that exchange, or null if refused. */
  authFrames(conn: WireConn, rng: Rng, n: number): Promise<Buffer[] | null>;
  /** A frame with valid framing aimed at a logged-in session; `inTransaction`: never one that could commit. */
  softFrame(rng: Rng, inTransaction: boolean): Buffer;
  /** A frame with broken framing or an odd command; `inTransaction`: never one that could commit if a server ran it anyway. */
  hardFrame(rng: Rng, inTransaction: boolean): Buffer;
  login(conn: WireConn): Promise<boolean>;
  /** Opens a transaction and inserts a row in the must-stay-empty table; true once both are confirmed. */
  beginAndInsert(conn: WireConn, rng: Rng): Promise<boolean>;
  /** Sent after a well-framed run; the stream's `probed` must then hold. */
  probe: Buffer;
}

/**
 * Connection i's plan. Phases: connect (nothing sent yet), auth (a login started, then damaged or wrong
 * answers), query (logged in, well-framed frames, then a probe that must be answered), garbage (logged in,
 * then broken framing), txn (a transaction with one row inserted and confirmed, then fuzz that cannot
 * commit, then the client ends or vanishes). `stats.inserted` counts the rows that must never be committed.
 */
export function mixScenarios(p: Protocol): { scenario: (rng: Rng) => Scenario; stats: { inserted: number } } {
  const stats = { inserted: 0 };
  const scenario = (rng: Rng): Scenario => {
    const roll = rng.next();
    const softs = (n: number, inTxn = false) => Array.from({ length: n }, () => p.softFrame(rng, inTxn));
    const hards = (n: number, inTxn = false) => Array.from({ length: n }, () => p.hardFrame(rng, inTxn));
    if (roll < 0.15) return { phase: p.phases.connect, wellFramed: false, frames: Array.from({ length: rng.range(1, 5) }, () => p.connectFrame(rng)) };
    if (roll < 0.3) {
      // Filled once the server has answered the login's start, so good-looking answers carry its nonce.
      const frames: Buffer[] = [];
      const n = rng.range(1, 5);
      return {
        phase: p.phases.auth, wellFramed: false, frames,
        async prelude(conn) {
          const made = await p.authFrames(conn, rng, n);
          if (made) frames.push(...made);
          return made !== null;
        },
      };
    }
    if (roll < 0.68) return { phase: 'query', wellFramed: true, frames: softs(rng.range(20, 60)), prelude: (c) => p.login(c), probe: p.probe };
    if (roll < 0.88) return { phase: 'garbage', wellFramed: false, frames: [...softs(rng.range(5, 30)), ...hards(rng.range(1, 4))], prelude: (c) => p.login(c) };
    const vanish = rng.chance(0.5);
    return {
      phase: vanish ? 'txn-vanish' : 'txn-end', wellFramed: false, vanish,
      frames: [...softs(rng.range(3, 25), true), ...hards(rng.int(2), true)],
      async prelude(conn) {
        if (!(await p.login(conn)) || !(await p.beginAndInsert(conn, rng))) return false;
        stats.inserted++;
        return true;
      },
    };
  };
  return { scenario, stats };
}

/** What a protocol module supplies: frame-level validation of everything the server sent. */
export interface ServerStream {
  /**
   * null when the whole output is well formed (complete messages / packets of known shapes), else why not.
   * A last message cut off is not counted here: a server that closes with client bytes unread makes the kernel
   * send a reset, which drops its own unsent data (PostgreSQL and MariaDB do it too); `cutOff` tells.
   */
  malformed(output: Buffer, phase: string): string | null;
  /** Whether the output ends inside a message. */
  cutOff(output: Buffer, phase: string): boolean;
  /** Error answers found in the output (SQLSTATE or errno), for the summary. */
  errors(output: Buffer): string[];
  /** Whether the output holds the probe's answer. */
  probed(output: Buffer): boolean;
}

/** A client socket that keeps everything the server sends. */
export class WireConn {
  readonly socket: Socket;
  output = Buffer.alloc(0);
  /** The server sent more than the 1 MiB kept; the output is then not checked. */
  overflowed = false;
  closed = false;
  /** The socket error that ended the connection, if one did. */
  error: string | null = null;
  #waiters = new Set<() => void>();
  #closedPromise: Promise<void>;

  private constructor(socket: Socket) {
    this.socket = socket;
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => {
      // Keep at most 1 MiB: a result the fuzz asked for must not grow without bound.
      if (this.output.length > 1 << 20) this.overflowed = true;
      else this.output = Buffer.concat([this.output, chunk]);
      for (const w of this.#waiters) w();
    });
    socket.on('error', (err: NodeJS.ErrnoException) => {
      // ECONNRESET / EPIPE: the server closed on us, which is a close (kept for a failure's description).
      this.error = err.code ?? err.message;
    });
    this.#closedPromise = new Promise((resolve) =>
      socket.once('close', () => {
        this.closed = true;
        for (const w of this.#waiters) w();
        resolve();
      }),
    );
  }

  static open(host: string, port: number, timeoutMs: number): Promise<WireConn> {
    return new Promise((resolve, reject) => {
      const s = connect({ host, port });
      const timer = setTimeout(() => {
        s.destroy();
        reject(new Error(`connect to ${host}:${port} timed out`));
      }, timeoutMs);
      s.once('connect', () => {
        clearTimeout(timer);
        resolve(new WireConn(s));
      });
      s.once('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
    });
  }

  /** Resolves true once `test(output)` holds, false on close or after timeoutMs. */
  until(test: (out: Buffer) => boolean, timeoutMs: number): Promise<boolean> {
    if (test(this.output)) return Promise.resolve(true);
    if (this.closed) return Promise.resolve(false);
    return new Promise((resolve) => {
      const done = (v: boolean) => {
        clearTimeout(timer);
        this.#waiters.delete(check);
        resolve(v);
      };
      const check = () => {
        if (test(this.output)) done(true);
        else if (this.closed) done(false);
      };
      const timer = setTimeout(() => done(false), timeoutMs);
      this.#waiters.add(check);
    });
  }

  write(b: Buffer): boolean {
    if (this.closed || this.socket.destroyed || !this.socket.writable) return false;
    this.socket.write(b);
    return true;
  }

  /** Half-closes our side and waits for the server to close within timeoutMs; false when it did not. */
  async endAndWait(timeoutMs: number): Promise<boolean> {
    if (!this.closed) this.socket.end();
    const timer = new Promise<false>((r) => setTimeout(() => r(false), timeoutMs).unref());
    const ok = await Promise.race([this.#closedPromise.then(() => true as const), timer]);
    if (!ok) this.socket.destroy();
    return ok;
  }

  destroy(): Promise<void> {
    this.socket.destroy();
    return this.#closedPromise;
  }
}

const tick = () => new Promise<void>((r) => setImmediate(r));

export interface FuzzReport {
  seed: number;
  connections: number;
  framesWritten: number;
  phases: Record<string, number>;
  hung: string[];
  malformed: string[];
  unprobed: string[];
  /** Connections whose login (or BEGIN + INSERT) was refused: fine for a server under load, listed to be read. */
  refusedPreludes: string[];
  errorCodes: Record<string, number>;
  closedBeforeEnd: number;
  vanished: number;
  /** Connections whose output ended inside a message (data in flight lost to a reset). */
  cutOff: number;
}

/**
 * Opens connections (`parallel` at a time) until `frames` frames have been written. Each writes its scenario's
 * frames, split at random points across writes or coalesced, then (well-framed scenarios) a probe, then
 * half-closes. The server must then close within `closeMs`; its output must be well formed throughout.
 */
export async function runFuzz(opts: {
  host: string;
  port: number;
  seed: number;
  frames: number;
  parallel: number;
  maxConnections: number;
  closeMs: number;
  scenario(rng: Rng, index: number): Scenario;
  stream: ServerStream;
  /** The service's state, added to a failure's description (e.g. slots and connections held then). */
  diagnose?: () => string;
}): Promise<FuzzReport> {
  // FUZZ_ONLY=<i>[,<j>…] replays just those connections of the seed's run.
  const only = process.env.FUZZ_ONLY ? process.env.FUZZ_ONLY.split(',').map(Number) : null;
  const report: FuzzReport = {
    seed: opts.seed, connections: 0, framesWritten: 0, phases: {}, hung: [], malformed: [], unprobed: [],
    refusedPreludes: [], errorCodes: {}, closedBeforeEnd: 0, vanished: 0, cutOff: 0,
  };
  let next = 0;
  const one = async (index: number) => {
    const rng = Rng.forConnection(opts.seed, index);
    const sc = opts.scenario(rng, index);
    const tag = `#${index} ${sc.phase}`;
    report.phases[sc.phase] = (report.phases[sc.phase] ?? 0) + 1;
    const conn = await WireConn.open(opts.host, opts.port, opts.closeMs);
    try {
      if (sc.prelude && !(await sc.prelude(conn))) {
        report.refusedPreludes.push(`${tag}: ${describe(conn.output)}`);
        await conn.endAndWait(opts.closeMs);
        return;
      }
      let pending: Buffer[] = [];
      for (const frame of sc.frames) {
        if (conn.closed) break;
        if (rng.chance(0.3) && frame.length > 1) {
          // Split at random points: each piece is its own write, a tick apart.
          const cuts = [...new Set([rng.range(1, frame.length - 1), rng.range(1, frame.length - 1)])].sort((a, b) => a - b);
          let at = 0;
          if (pending.length) conn.write(Buffer.concat(pending));
          pending = [];
          for (const cut of [...cuts, frame.length]) {
            conn.write(frame.subarray(at, cut));
            at = cut;
            await tick();
          }
        } else {
          pending.push(frame);
          // Sometimes several frames go out in one write.
          if (rng.chance(0.6)) {
            conn.write(Buffer.concat(pending));
            pending = [];
            await tick();
          }
        }
        report.framesWritten++;
      }
      if (pending.length) conn.write(Buffer.concat(pending));
      if (conn.closed) report.closedBeforeEnd++;
      if (sc.wellFramed && sc.probe && !conn.closed) {
        conn.write(sc.probe);
        const answered = await conn.until((o) => opts.stream.probed(o), opts.closeMs);
        // A well-framed scenario may still be closed by the server, but only with an error answer first.
        if (!answered && !(conn.closed && opts.stream.errors(conn.output).length > 0)) report.unprobed.push(`${tag}: ${describe(conn.output)}${conn.closed ? `, closed${conn.error ? ` by ${conn.error}` : ''}` : ', no answer in time'}${opts.diagnose ? ` [then: ${opts.diagnose()}]` : ''}`);
      }
      if (sc.vanish) {
        // Give the server a moment to act on the frames (or not), then drop the connection without a word.
        await conn.until(() => false, 20);
        await conn.destroy();
        report.vanished++;
      } else if (!(await conn.endAndWait(opts.closeMs))) report.hung.push(`${tag}: still open ${opts.closeMs} ms after our FIN`);
      if (process.env.FUZZ_DEBUG) {
        // Replaying single connections: show what went each way.
        const show = (b: Buffer) => b.toString('latin1').replace(/[^\x20-\x7e]/g, '.');
        process.stderr.write(`--- ${tag}\n${sc.frames.map((f, i) => `> ${i}: ${show(f.subarray(0, 200))}`).join('\n')}\n< ${show(conn.output)}\n`);
      }
      const bad = conn.overflowed ? null : opts.stream.malformed(conn.output, sc.phase);
      if (!conn.overflowed && opts.stream.cutOff(conn.output, sc.phase)) report.cutOff++;
      if (bad) report.malformed.push(`${tag}: ${bad}`);
      for (const code of opts.stream.errors(conn.output)) report.errorCodes[code] = (report.errorCodes[code] ?? 0) + 1;
    } finally {
      if (!conn.closed) await conn.destroy();
    }
  };
  const worker = async () => {
    while (only ? next < only.length : report.framesWritten < opts.frames && next < opts.maxConnections) {
      const index = only ? only[next++]! : next++;
      report.connections++;
      await one(index);
    }
  };
  await Promise.all(Array.from({ length: opts.parallel }, worker));
  return report;
}

function describe(out: Buffer): string {
  return `${out.length} bytes, ending: ${out.subarray(-240).toString('latin1').replace(/[^\x20-\x7e]/g, '.')}`;
}

/**
 * The seed: 777 unless FUZZ_SEED says otherwise (`FUZZ_SEED=random` draws one). A fixed default keeps the
 * suite reproducible, and safe for the shared servers: other seeds reach server bugs (seed 5 makes the
 * PostgreSQL 15.20 backend segfault, which restarts the whole server), so explore them against a private server.
 */
export function fuzzSeed(): number {
  const env = process.env.FUZZ_SEED;
  if (env === 'random') return Math.floor(Math.random() * 2 ** 32) >>> 0;
  return env && /^\d+$/.test(env) ? Number(env) >>> 0 : 777;
}
