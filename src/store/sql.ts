// The narrow store interface: one SQL dialect (PostgreSQL) over the embedded PGlite engine or a real server.

export type SqlParam = string | number | boolean | null | Date | Buffer | Uint8Array | readonly (string | number | boolean | null)[];

export interface QueryResult<R> {
  rows: R[];
  rowCount: number;
}

export interface Queryable {
  query<R = Record<string, unknown>>(text: string, params?: readonly SqlParam[]): Promise<QueryResult<R>>;
}

export interface Sql extends Queryable {
  readonly engine: 'pglite' | 'postgres';
  /** Runs fn in one transaction: committed when it resolves, rolled back when it throws. */
  transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T>;
  /** Runs a multi-statement script (migrations). */
  exec(script: string): Promise<void>;
  /** Subscribes to NOTIFY on a channel; the returned function unsubscribes. */
  listen(channel: string, onPayload: (payload: string) => void): Promise<() => Promise<void>>;
  notify(channel: string, payload: string): Promise<void>;
  close(): Promise<void>;
}

/** The one change-feed channel: payloads name what changed, e.g. `pool:12`, `key:7`, `webhook:3`. */
export const CHANGE_CHANNEL = 'poolgate_changes';

/** NOTIFY channel that wakes the webhook deliverer when deliveries become due (enqueue, replay; at commit). */
export const DELIVERY_CHANNEL = 'poolgate_deliveries';
