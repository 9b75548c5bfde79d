-- The webhook outbox: one row per (job event, active destination), written in the jobs runner's transaction.
-- The body is fixed at enqueue (every retry sends the same bytes); the signature is made at send time with
-- the destination's current secret. A row is deleted when delivered or given up (webhook_delivery_attempts
-- keeps the history). job_id is text and has no foreign key: jobs live in another module's tables.
CREATE TABLE webhook_deliveries (
  id                   bigserial PRIMARY KEY,
  webhook_endpoint_id  integer NOT NULL REFERENCES webhook_endpoints(id) ON DELETE CASCADE,
  job_id               text NOT NULL,
  pool_id              integer REFERENCES pools(id) ON DELETE SET NULL,
  event_type           text NOT NULL,
  body                 bytea NOT NULL,
  body_sha256          text NOT NULL,
  -- Attempts started so far (a claim counts as an attempt, so a crash mid-send is counted too).
  attempts             integer NOT NULL DEFAULT 0,
  -- When the row is next due; a claim moves it one lease ahead, so a crashed sender's row comes back.
  next_attempt_at      timestamptz NOT NULL DEFAULT now(),
  enqueued_at          timestamptz NOT NULL DEFAULT now(),
  UNIQUE (webhook_endpoint_id, job_id, event_type)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at);
