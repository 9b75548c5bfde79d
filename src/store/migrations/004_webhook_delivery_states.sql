-- Deliveries stay in the outbox after they finish, so one can be replayed (and failed ones recovered) with the
-- exact bytes of the event: status pending → delivered or failed (given up), finished_at set when it leaves
-- pending. Finished rows are pruned after webhookReplayRetentionHours. The indexes serve the deliverer's
-- per-destination claim and its probe (pending rows only), and the pruning.
ALTER TABLE webhook_deliveries ADD COLUMN status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed'));
ALTER TABLE webhook_deliveries ADD COLUMN finished_at timestamptz;
DROP INDEX webhook_deliveries_due;
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_dest_due ON webhook_deliveries (webhook_endpoint_id, next_attempt_at, id) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries (webhook_endpoint_id, finished_at) WHERE status <> 'pending';
