// The pool access log: one JSON line per request through pino on a buffered (async) destination, so
// writing it never waits on the disk; successful requests can be sampled, refusals and errors never are.
import { pino, type Logger } from 'pino';
import type { OutcomeName } from './exchange.js';

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
}

export class AccessLog {
  readonly #log: Logger;
  readonly #destination: ReturnType<typeof pino.destination>;
  readonly #sample: number;
  readonly #toFile: boolean;
  #seen = 0;

  /** `file` null writes to stderr; `sample` N logs one successful request in N (0: none). */
  constructor(opts: { file: string | null; sample: number }) {
    this.#destination = opts.file
      ? pino.destination({ dest: opts.file, sync: false, mkdir: true, minLength: 4096 })
      : pino.destination({ fd: 2, sync: false });
    this.#log = pino({ base: { log: 'access' }, timestamp: pino.stdTimeFunctions.isoTime }, this.#destination);
    this.#sample = opts.sample;
    this.#toFile = opts.file !== null;
  }

  write(r: AccessRecord): void {
    if ((r.outcome === 'proxied' || r.outcome === 'lease_granted' || r.outcome === 'job_accepted') && r.status < 500) {
      if (this.#sample === 0) return;
      if (this.#sample > 1 && this.#seen++ % this.#sample !== 0) return;
    }
    this.#log.info(r);
  }

  /** Flushes what is buffered and closes a file destination. */
  async close(): Promise<void> {
    await new Promise<void>((resolve) => {
      this.#destination.flush((err) => {
        void err;
        resolve();
      });
    }).catch(() => {});
    if (this.#toFile) this.#destination.end();
  }
}
