// A database pool's job as the runner sees it: a function that runs the stored SQL body with the pool's
// connections and resolves to the job's detail or the error answer. db/sql-over-http.ts implements it; the
// worker role passes it in, so jobs/ does not import db/ (which spills its async requests into jobs/).
import type { PoolEntry } from '../pool-request/snapshot.js';

/** What the async jobs runner gets for a stored SQL request: the job detail, or the error answer. */
export type SqlJobOutcome =
  | { ok: true; status: 200; detail: { kind: 'database'; columns?: unknown[]; rows?: unknown[]; results?: unknown[] } & Record<string, unknown> }
  | { ok: false; status: number; body: Record<string, unknown> };

/** Runs a stored SQL request for its pool; the caller holds the slot. Resolves, never rejects. */
export type RunSqlJob = (pool: PoolEntry, body: Buffer) => Promise<SqlJobOutcome>;
