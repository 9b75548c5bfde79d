// A worker thread's metrics sink: finished requests and policy refusals are batched and posted to the
// main thread, which counts them in /metrics and the rollups (one message per batch, not per request; the
// records packed, record-codec.ts).
import type { DataplaneMetrics, RequestRecord } from '../../pool-request/release.js';
import type { FromWorker } from './messages.js';
import { RecordPacker } from './record-codec.js';

/** A batch is sent when it has this many records, or FLUSH_MS after its first one. */
const MAX_BATCH = 256;
const FLUSH_MS = 50;

export class RecordBatch implements DataplaneMetrics {
  readonly #post: (m: FromWorker) => void;
  readonly #records = new RecordPacker(MAX_BATCH);
  #refusals: Array<[string, string, string]> = [];
  #timer: NodeJS.Timeout | null = null;

  constructor(post: (m: FromWorker) => void) {
    this.#post = post;
  }

  record(r: RequestRecord): void {
    // Packed now: only the admission's summary is kept (the admission itself holds the permit).
    this.#records.push(r);
    this.#due();
  }

  policyRefused(pool: string, policy: string, reason: string): void {
    this.#refusals.push([pool, policy, reason]);
    this.#due();
  }

  #due(): void {
    if (this.#records.length + this.#refusals.length >= MAX_BATCH) this.flush();
    else this.#timer ??= setTimeout(() => this.flush(), FLUSH_MS);
  }

  /** Sends what is pending now. */
  flush(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    const records = this.#records.take();
    if (records === null && this.#refusals.length === 0) return;
    this.#post({ t: 'records', records, refusals: this.#refusals });
    this.#refusals = [];
  }
}
