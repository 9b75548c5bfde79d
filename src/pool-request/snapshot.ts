// The snapshot a pool request is judged against: pools by subdomain, live keys by hash, opened origin
// credentials and budgets. The data plane loads it (src/dataplane/snapshot-source.ts); every front door
// (HTTP listener, lock API, job polling, SQL over HTTP, wire listeners, job runner) reads these types.
import type { BudgetLimits } from '../governor/governor.js';
import type { CredentialSecret } from '../store/credentials.js';
import type { PoolSettings } from '../store/pool-settings.js';

export interface PoolEntry {
  readonly id: number;
  readonly subdomain: string;
  readonly backend: 'http' | 'postgres' | 'mysql';
  readonly status: 'active' | 'suspended';
  /** https origin without a trailing slash, e.g. `https://api.example.com:8443`; null for database pools. */
  readonly origin: string | null;
  /** host[:port] of the origin, sent as Host upstream. */
  readonly originHost: string | null;
  readonly maxConcurrent: number;
  readonly requireKey: boolean;
  readonly settings: PoolSettings;
  /** Methods a `read` key admits, and the path prefixes each extra read method is limited to. */
  readonly readMethods: ReadonlySet<string>;
  readonly readPaths: ReadonlyMap<string, readonly string[]>;
  readonly budgetId: number | null;
  readonly reservedConcurrent: number;
  /** The managed origin credential, opened; null when none is attached (or it could not be opened). */
  readonly credential: CredentialSecret | null;
  /** The upstream database of a `postgres`/`mysql` pool; null for http pools (or a row missing its host). */
  readonly database: DatabaseTarget | null;
  /** Async mode (spec rule 5): on, jobs when busy, and at least one active (not disabled) attached destination. */
  readonly asyncEnabled: boolean;
  readonly asyncOnQueue: boolean;
  readonly hasActiveDestination: boolean;
}

export interface DatabaseTarget {
  readonly host: string;
  /** null: the backend's default port (5432, 3306). */
  readonly port: number | null;
  readonly name: string;
  readonly sslmode: 'verify-full' | 'require';
}

export interface KeyEntry {
  readonly id: number;
  readonly poolId: number;
  readonly access: 'read' | 'write';
  /** Unix ms; checked against the clock on every request. */
  readonly expiresAt: number | null;
  /** The key's HMAC signing secret, opened (origin signing); null when it has none. */
  readonly signingSecret: string | null;
}

export interface Snapshot {
  readonly pools: ReadonlyMap<string, PoolEntry>;
  readonly keys: ReadonlyMap<string, KeyEntry>;
  readonly budgets: readonly BudgetLimits[];
  readonly loadedAt: number;
  /**
   * Bumped each time `keys` is patched in place (key point updates, here and in a thread's copy). A check
   * made against this snapshot at the same count still holds: the wire listeners re-check a client's key
   * only when it moved.
   */
  keyEdits: number;
}

export const EMPTY_SNAPSHOT: Snapshot = { pools: new Map(), keys: new Map(), budgets: [], loadedAt: 0, keyEdits: 0 };

/** One key's point update: its hash and its new entry, or null when it left the snapshot. */
export type KeyChange = readonly [hash: string, entry: KeyEntry | null];

/** Where the data plane reads its snapshot: a SnapshotSource on the store, or the main thread's pushes in a worker thread. */
export interface SnapshotFeed {
  readonly current: Snapshot;
  /** Has the first snapshot (a failure fails start-up) and follows changes. */
  start(): Promise<void>;
  /** Asks for a full reload; resolves once one that started after the call is applied. */
  reload(): Promise<void>;
  close(): Promise<void>;
}
