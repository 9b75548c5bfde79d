-- Async jobs: the spilled request, its claim lease while a runner holds it, and the stored result.
-- Statuses: queued → running → completed | failed | expired (see docs/jobs-and-webhooks.md).

CREATE TABLE jobs (
  id                text PRIMARY KEY,            -- job_<32 random bytes, base64url>: unguessable
  pool_id           integer NOT NULL REFERENCES pools(id) ON DELETE CASCADE,
  reason            text NOT NULL CHECK (reason IN ('requested', 'busy', 'wait_timeout')),
  status            text NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'running', 'completed', 'failed', 'expired')),
  method            text NOT NULL,
  path              text NOT NULL,
  query             text NOT NULL DEFAULT '',
  headers           jsonb NOT NULL,              -- client headers minus pool auth and hop-by-hop
  client_address    text NOT NULL,
  body              bytea,
  attempts          integer NOT NULL DEFAULT 0,  -- upstream attempts started (claims)
  run_after         timestamptz NOT NULL DEFAULT now(),  -- retry backoff: not claimable before
  expires_at        timestamptz NOT NULL,        -- created_at + the pool's jobTtlMs
  claim_token       text,                        -- fences a runner whose lease lapsed
  lease_until       timestamptz,
  result_status     integer,
  result_headers    jsonb,
  result_body       bytea,
  result_truncated  boolean NOT NULL DEFAULT false,
  error             text,
  created_at        timestamptz NOT NULL DEFAULT now(),
  completed_at      timestamptz
);
-- The runner's two scans: claimable jobs per pool, and leases to recover. Finished jobs are not indexed.
CREATE INDEX jobs_claimable ON jobs (pool_id, run_after) WHERE status = 'queued';
CREATE INDEX jobs_running ON jobs (lease_until) WHERE status = 'running';
-- Retention: finished jobs are deleted a while after their terminal status.
CREATE INDEX jobs_finished ON jobs (completed_at) WHERE completed_at IS NOT NULL;
