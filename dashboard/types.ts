// Shapes of the Control API answers the pages read (the OpenAPI document is the authority).
export interface Pool {
  id: number; name: string; description?: string | null; subdomain: string; backend: 'http' | 'postgres' | 'mysql';
  max_concurrent: number; require_key: boolean; has_credential: boolean;
  budget?: { id: number; name: string; reserved_concurrent: number } | null;
}
export interface PoolLive {
  pool_id: number; subdomain: string; name: string; backend: string; max_concurrent: number; reporting: boolean;
  in_flight: number | null; queued: number | null; effective_limit: number | null;
  last_minute: { admitted: number; status_429: number; status_504: number; status_5xx: number } | null;
}
export interface PoolKey {
  id: number; label: string; last_four: string; access: 'read' | 'write'; allowed_methods: string[];
  expires_at?: string | null; revoked_at?: string | null; created_at?: string | null; key?: string; signing_secret?: string;
}
export interface Budget { id: number; name: string; pool_ids: number[]; origin_max_concurrent: number | null; unallocated: number }
export interface Webhook { id: number; name: string; description?: string | null; url: string; disabled: boolean; pool_ids: number[]; signing_secret?: string }
export interface Delivery { time: string; job_id: string; pool_id: number | null; pool: string | null; result: 'success' | 'failure'; http_status: number | null; error: string | null; attempt: number; latency_ms: number }
export interface Minute {
  minute: string; requests: number; admitted: number; queued: number; rejected: number; upstream_errors: number;
  queue_wait_p50_ms: number | null; queue_wait_p95_ms: number | null; upstream_p50_ms: number | null; upstream_p95_ms: number | null;
  effective_limit: number | null;
}
export interface Settings {
  pool_id: number; subdomain: string; max_concurrent: number; require_key: boolean; async_enabled: boolean; async_on_queue: boolean;
  settings: Record<string, unknown>;
}
export interface Session { csrf_token: string; user_id: number; team_id: number; abilities: string[] }
export interface Me { user: { id: number; name: string; email: string }; team: { id: number; name: string; slug: string }; abilities: string[] }
export type AdjustmentCause = 'latency_gradient' | 'growth' | 'status_429' | 'throttled' | 'rate_headers' | 'probe' | 'probe_end';
export interface PoolLimit {
  max_concurrent: number; adaptive: boolean; adaptive_min: number; reporting: boolean; effective_limit: number | null; probing: boolean;
  short_rtt_ms: number | null; long_rtt_ms: number | null;
  adjustments: Array<{ time: string; from: number; to: number; cause: AdjustmentCause; short_rtt_ms: number; long_rtt_ms: number }>;
}
