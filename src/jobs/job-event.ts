// The event a job emits when it reaches a terminal status: what the jobs runner hands to the webhook
// outbox (in the same transaction as the status change) and what the envelope is made from.

export type TerminalStatus = 'completed' | 'failed' | 'expired';
export type JobReason = 'requested' | 'busy' | 'wait_timeout';

export type JobDetail =
  | { kind: 'http'; status: number; headers: Record<string, string>; body: string; truncated?: true }
  | { kind: 'http'; resultUrl: string; truncated?: true }
  // A database pool's answer: `status` is what the sync endpoint would have answered (200, or the 4xx of a
  // database error, then in `error`); the rest is the sync body — one statement, or `results` of a batch.
  | {
      kind: 'database';
      status: number;
      command?: string;
      rowCount?: number | null;
      columns?: unknown[];
      rows?: unknown[];
      lastInsertId?: string;
      results?: unknown[];
      error?: Record<string, unknown>;
      truncated?: true;
    }
  | { kind: 'database'; status: number; resultUrl: string; truncated?: true };

export interface JobEvent {
  jobId: string;
  poolId: number;
  /** Canonical pool hostname, `<subdomain>.<poolDomain>`. */
  poolHost: string;
  status: TerminalStatus;
  reason: JobReason;
  /** Unix milliseconds. */
  createdAt: number;
  completedAt: number;
  /** Omitted when there is nothing to report (for example some expired jobs). */
  detail?: JobDetail;
}

export const EVENT_TYPE: Record<TerminalStatus, string> = {
  completed: 'async.job.completed',
  failed: 'async.job.failed',
  expired: 'async.job.expired',
};
