// Finished requests packed for the trip from a data plane thread to the main thread. Posted as objects, each
// record was cloned field by field, its property names included: ~1 µs to serialize in the thread and ~2 µs to
// read back on the main thread per request (Node 24), the main thread's largest cost per request with two
// threads. Packed, a batch is one Float64Array (numbers, copied as one block) and the few distinct strings in it
// (pool names, outcomes, refusal reasons), each sent once a batch.
import type { RefusalReason } from '../../governor/governor.js';
import type { AdmissionSummary } from '../../metrics/registry.js';
import type { RequestRecord } from '../../pool-request/release.js';

/** A batch of packed records: `n` records of FIELDS numbers each in `data`; strings are indexes into `strings`. */
export interface PackedRecords {
  n: number;
  data: Float64Array;
  strings: string[];
}

// Field offsets within one record.
const POOL_ID = 0;
const POOL = 1;
const STATUS = 2;
const OUTCOME = 3;
/** 0: no admission (stopped before the governor); 1: admitted; 2: refused. */
const ADMISSION = 4;
/** The refusal reason's string index; -1 when admitted or no admission. */
const REASON = 5;
const ADMISSION_QUEUED_MS = 6;
const WAITED = 7;
const QUEUED_MS = 8;
/** NaN for null. */
const UPSTREAM_MS = 9;
const FIELDS = 10;

export class RecordPacker {
  #data: Float64Array;
  #n = 0;
  #strings: string[] = [];
  #index = new Map<string, number>();

  constructor(capacity: number) {
    this.#data = new Float64Array(capacity * FIELDS);
  }

  get length(): number {
    return this.#n;
  }

  push(r: RequestRecord): void {
    if ((this.#n + 1) * FIELDS > this.#data.length) {
      const grown = new Float64Array(this.#data.length * 2);
      grown.set(this.#data);
      this.#data = grown;
    }
    const d = this.#data;
    const at = this.#n * FIELDS;
    const a = r.admission;
    d[at + POOL_ID] = r.poolId;
    d[at + POOL] = this.#intern(r.pool);
    d[at + STATUS] = r.status;
    d[at + OUTCOME] = this.#intern(r.outcome);
    d[at + ADMISSION] = a === null ? 0 : a.ok ? 1 : 2;
    d[at + REASON] = a !== null && !a.ok ? this.#intern(a.reason) : -1;
    d[at + ADMISSION_QUEUED_MS] = a === null ? 0 : a.queuedMs;
    d[at + WAITED] = r.waited ? 1 : 0;
    d[at + QUEUED_MS] = r.queuedMs;
    d[at + UPSTREAM_MS] = r.upstreamMs ?? NaN;
    this.#n++;
  }

  /** The records pushed since the last take (null when none); the packer starts empty again. */
  take(): PackedRecords | null {
    if (this.#n === 0) return null;
    const packed = { n: this.#n, data: this.#data.slice(0, this.#n * FIELDS), strings: this.#strings };
    this.#n = 0;
    this.#strings = [];
    this.#index.clear();
    return packed;
  }

  #intern(s: string): number {
    let i = this.#index.get(s);
    if (i === undefined) {
      i = this.#strings.length;
      this.#strings.push(s);
      this.#index.set(s, i);
    }
    return i;
  }
}

/** Calls `each` with every record of a batch, as it was pushed (a new object each: sinks may keep them). */
export function unpackRecords(p: PackedRecords, each: (r: RequestRecord) => void): void {
  const { data: d, strings } = p;
  for (let i = 0; i < p.n; i++) {
    const at = i * FIELDS;
    const kind = d[at + ADMISSION];
    const queued = d[at + ADMISSION_QUEUED_MS]!;
    const admission: AdmissionSummary | null =
      kind === 0 ? null : kind === 1 ? { ok: true, queuedMs: queued } : { ok: false, reason: strings[d[at + REASON]!] as RefusalReason, queuedMs: queued };
    const upstreamMs = d[at + UPSTREAM_MS]!;
    each({
      poolId: d[at + POOL_ID]!,
      pool: strings[d[at + POOL]!]!,
      status: d[at + STATUS]!,
      outcome: strings[d[at + OUTCOME]!] as RequestRecord['outcome'],
      admission,
      waited: d[at + WAITED] === 1,
      queuedMs: d[at + QUEUED_MS]!,
      upstreamMs: Number.isNaN(upstreamMs) ? null : upstreamMs,
    });
  }
}
