// What the main thread and the data plane worker threads say to each other (structured clone over the
// worker's port). The main thread holds the store: snapshots flow out, counts and job inserts flow in.
import type { Config } from '../../config/schema.js';
import type { SharedGovernorHandle } from '../../governor/shared-memory.js';
import type { NewJob } from '../../jobs/job-store.js';
import type { NonceClaim } from '../../policies/nonce-store.js';
import type { KeyChange, Snapshot } from '../../pool-request/snapshot.js';
import type { PackedRecords } from './record-codec.js';

/** A worker thread's start-up data. */
export interface WorkerStart {
  config: Config;
  /** This thread's handle of the main thread's governor (SharedMemoryGovernor.handle()). */
  governor: SharedGovernorHandle;
  /** The port this thread listens on (0: a free one; the first thread's port for the others when shared). */
  port: number;
  /** The snapshot current when the thread was made; later ones arrive as messages. */
  snapshot: Snapshot;
  /** The lock API's public address at start (job poll URLs); each job reply brings the current one. */
  lockApiUrl: string;
  drainMs: number;
}

/** Main thread → worker thread. */
export type ToWorker =
  | { t: 'snapshot'; snapshot: Snapshot }
  | { t: 'keys'; changes: readonly KeyChange[] }
  | { t: 'spilled'; id: number; ok: boolean; lockApiUrl: string }
  | { t: 'nonced'; id: number; claim: NonceClaim }
  | { t: 'close' }
  /** Throw an uncaught error (tests of the crash path: the thread closes, exits 1, and is replaced). */
  | { t: 'crash' };

/** Worker thread → main thread. */
export type FromWorker =
  | { t: 'listening'; port: number }
  | { t: 'failed'; message: string }
  /** Finished requests (packed; null when none) and policy refusals since the last batch, for /metrics and the rollups. */
  | { t: 'records'; records: PackedRecords | null; refusals: Array<[pool: string, policy: string, reason: string]> }
  /** An async job to store; answered with `spilled` of the same id. */
  | { t: 'spill'; id: number; job: NewJob }
  /** An HMAC nonce to claim in the main thread's store (one store, so a replay to another thread is caught); answered with `nonced`. */
  | { t: 'nonce'; id: number; nonce: string; ttlMs: number }
  | { t: 'closed' };
