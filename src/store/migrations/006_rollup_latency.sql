-- Per-minute latency and limit rollups for the dashboard's Pool charts (issue 17): queue wait and
-- upstream latency as fixed-bucket histograms (bucket i counts values <= LATENCY_BOUNDS_MS[i] in
-- src/metrics/latency-buckets.ts, the last bucket everything above), added element-wise on every flush so
-- several writers and partial-minute flushes merge exactly; p50/p95 are read from them. effective_limit_min
-- is the lowest effective limit sampled in the minute (null: not sampled).
ALTER TABLE pool_metrics_minute ADD COLUMN upstream_errors bigint NOT NULL DEFAULT 0;
ALTER TABLE pool_metrics_minute ADD COLUMN queue_wait_hist bigint[];
ALTER TABLE pool_metrics_minute ADD COLUMN upstream_hist bigint[];
ALTER TABLE pool_metrics_minute ADD COLUMN effective_limit_min integer;
