// Webhook destinations, their pool attachments and their delivery history (tables webhook_endpoints,
// pool_webhooks, webhook_delivery_attempts). Every lookup is scoped to the team.
import type { WebhookEndpointT } from '../domain/webhook.js';
import { CHANGE_CHANNEL, DELIVERY_CHANNEL, type Queryable, type Sql } from './sql.js';

export interface WebhookRow {
  id: number;
  team_id: number;
  name: string;
  description: string | null;
  url: string;
  disabled: boolean;
  consecutive_failures: number;
  signing_secret_enc: string;
  credential_id: number | null;
  auth_header: string | null;
  /** Attached live pools, ascending. */
  pool_ids: number[];
}

// Deleted pools keep their rows (status 'deleted') but are no longer attachments anyone can see.
const WEBHOOK_SELECT = `
  SELECT w.id, w.team_id, w.name, w.description, w.url, w.disabled, w.consecutive_failures,
         w.signing_secret_enc, w.credential_id, w.auth_header,
         COALESCE((SELECT array_agg(pw.pool_id ORDER BY pw.pool_id)
                     FROM pool_webhooks pw JOIN pools p ON p.id = pw.pool_id
                    WHERE pw.webhook_endpoint_id = w.id AND p.status <> 'deleted'), '{}') AS pool_ids
    FROM webhook_endpoints w`;

/** The Control API view (spec: WebhookEndpoint); the signing secret is added by the caller when shown once. */
export function webhookView(row: WebhookRow): WebhookEndpointT {
  return {
    id: row.id,
    name: row.name,
    description: row.description,
    url: row.url,
    disabled: row.disabled,
    pool_ids: row.pool_ids,
  };
}

export async function listWebhooks(db: Queryable, teamId: number): Promise<WebhookRow[]> {
  const { rows } = await db.query<WebhookRow>(`${WEBHOOK_SELECT} WHERE w.team_id = $1 ORDER BY w.id`, [teamId]);
  return rows;
}

/** A destination of the team; another team's destination is simply not found. `lock` takes a row lock. */
export async function findWebhook(db: Queryable, teamId: number, id: number, lock = false): Promise<WebhookRow | null> {
  const { rows } = await db.query<WebhookRow>(
    `${WEBHOOK_SELECT} WHERE w.team_id = $1 AND w.id = $2${lock ? ' FOR UPDATE OF w' : ''}`,
    [teamId, id],
  );
  return rows[0] ?? null;
}

export async function countWebhooks(db: Queryable, teamId: number): Promise<number> {
  const { rows } = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM webhook_endpoints WHERE team_id = $1', [teamId]);
  return rows[0]!.n;
}

export async function webhookNameTaken(db: Queryable, teamId: number, name: string): Promise<boolean> {
  const { rows } = await db.query('SELECT 1 FROM webhook_endpoints WHERE team_id = $1 AND name = $2', [teamId, name]);
  return rows.length > 0;
}

export interface NewWebhook {
  teamId: number;
  name: string;
  description: string | null;
  url: string;
  signingSecretEnc: string;
  credentialId: number | null;
  authHeader: string | null;
}

export async function insertWebhook(db: Queryable, w: NewWebhook): Promise<number> {
  const { rows } = await db.query<{ id: number }>(
    `INSERT INTO webhook_endpoints (team_id, name, description, url, signing_secret_enc, credential_id, auth_header)
     VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`,
    [w.teamId, w.name, w.description, w.url, w.signingSecretEnc, w.credentialId, w.authHeader],
  );
  return rows[0]!.id;
}

export async function setSigningSecret(db: Queryable, id: number, signingSecretEnc: string): Promise<void> {
  await db.query('UPDATE webhook_endpoints SET signing_secret_enc = $2, updated_at = now() WHERE id = $1', [id, signingSecretEnc]);
}

/** Live pools of the team among `ids` (ids of other teams or deleted pools are absent from the answer). */
export async function teamPoolIds(db: Queryable, teamId: number, ids: readonly number[]): Promise<Set<number>> {
  const { rows } = await db.query<{ id: number }>(
    `SELECT id FROM pools WHERE team_id = $1 AND id = ANY($2::int[]) AND status <> 'deleted'`,
    [teamId, ids],
  );
  return new Set(rows.map((r) => r.id));
}

/** Destinations of the team among `ids`. */
export async function teamWebhookIds(db: Queryable, teamId: number, ids: readonly number[]): Promise<Set<number>> {
  const { rows } = await db.query<{ id: number }>(
    'SELECT id FROM webhook_endpoints WHERE team_id = $1 AND id = ANY($2::int[])',
    [teamId, ids],
  );
  return new Set(rows.map((r) => r.id));
}

/** Attaches one destination to pools (already attached pairs are left as they are). */
export async function attachToPools(db: Queryable, webhookId: number, poolIds: readonly number[]): Promise<void> {
  if (poolIds.length === 0) return;
  await db.query(
    `INSERT INTO pool_webhooks (pool_id, webhook_endpoint_id) SELECT unnest($1::int[]), $2 ON CONFLICT DO NOTHING`,
    [poolIds, webhookId],
  );
}

/** Replaces the destinations attached to one pool. */
export async function replacePoolWebhooks(db: Queryable, poolId: number, webhookIds: readonly number[]): Promise<void> {
  await db.query('DELETE FROM pool_webhooks WHERE pool_id = $1', [poolId]);
  if (webhookIds.length === 0) return;
  await db.query(`INSERT INTO pool_webhooks (pool_id, webhook_endpoint_id) SELECT $1, unnest($2::int[])`, [poolId, webhookIds]);
}

export async function poolWebhookIds(db: Queryable, poolId: number): Promise<number[]> {
  const { rows } = await db.query<{ id: number }>(
    'SELECT webhook_endpoint_id AS id FROM pool_webhooks WHERE pool_id = $1 ORDER BY webhook_endpoint_id',
    [poolId],
  );
  return rows.map((r) => r.id);
}

/** Turns async on for the given pools and returns those that were off before (spec: async_enabled_on_pool_ids). */
export async function enableAsync(db: Queryable, poolIds: readonly number[]): Promise<number[]> {
  if (poolIds.length === 0) return [];
  const { rows } = await db.query<{ id: number }>(
    `UPDATE pools SET async_enabled = true, updated_at = now()
      WHERE id = ANY($1::int[]) AND async_enabled = false RETURNING id`,
    [poolIds],
  );
  return rows.map((r) => r.id).sort((a, b) => a - b);
}

/**
 * The dashboard's Re-enable: active again with a fresh failure streak. The change feed is told in the same
 * transaction (as the deliverer's deactivation does), so the data plane makes the destination's pools
 * async again, and the deliverer sends the kept deliveries, as soon as it commits.
 */
export async function reenableWebhook(sql: Sql, teamId: number, id: number): Promise<WebhookRow | null> {
  return sql.transaction(async (tx) => {
    const { rowCount } = await tx.query(
      `UPDATE webhook_endpoints SET disabled = false, consecutive_failures = 0, updated_at = now()
        WHERE team_id = $1 AND id = $2`,
      [teamId, id],
    );
    if (rowCount === 0) return null;
    await tx.query('SELECT pg_notify($1, $2)', [CHANGE_CHANNEL, `webhook:${id}`]);
    return findWebhook(tx, teamId, id);
  });
}

export interface DeliveryAttempt {
  time: string;
  job_id: string;
  pool_id: number | null;
  pool: string | null;
  result: 'success' | 'failure';
  http_status: number | null;
  error: string | null;
  attempt: number;
  latency_ms: number;
}

/** Delivery history of one destination (spec: Delivery semantics 4), newest first. */
export async function deliveryHistory(db: Queryable, webhookId: number, limit: number): Promise<DeliveryAttempt[]> {
  const { rows } = await db.query<Omit<DeliveryAttempt, 'time'> & { attempted_at: Date }>(
    `SELECT a.attempted_at, a.job_id, a.pool_id, p.subdomain AS pool, a.result, a.http_status, a.error, a.attempt, a.latency_ms
       FROM webhook_delivery_attempts a LEFT JOIN pools p ON p.id = a.pool_id
      WHERE a.webhook_endpoint_id = $1
      ORDER BY a.attempted_at DESC, a.id DESC
      LIMIT $2`,
    [webhookId, limit],
  );
  return rows.map(({ attempted_at, ...r }) => ({ time: new Date(attempted_at).toISOString(), ...r }));
}

export type DeliveryStatus = 'pending' | 'delivered' | 'failed';

export interface ReplayedDelivery {
  job_id: string;
  event_type: string;
  /** The delivery's status before the replay. */
  previous_status: DeliveryStatus;
  /** Attempts made so far; the replay is the next one. */
  attempts: number;
}

/**
 * Replay (Svix's resend): the destination's delivery of one job becomes pending and due now, whatever
 * its status. The same stored bytes are sent under the same job id, signed anew with the current secret
 * at send time. Null: no delivery of that job to that destination (never, or pruned past its retention).
 */
export async function replayDelivery(sql: Sql, webhookId: number, jobId: string): Promise<ReplayedDelivery[] | null> {
  return sql.transaction(async (tx) => {
    const { rows } = await tx.query<{ id: string; event_type: string; status: DeliveryStatus; attempts: number }>(
      `SELECT id, event_type, status, attempts FROM webhook_deliveries
        WHERE webhook_endpoint_id = $1 AND job_id = $2 ORDER BY id FOR UPDATE`,
      [webhookId, jobId],
    );
    if (rows.length === 0) return null;
    await tx.query(
      `UPDATE webhook_deliveries SET status = 'pending', finished_at = NULL, next_attempt_at = now() WHERE id = ANY($1::bigint[])`,
      [rows.map((r) => r.id)],
    );
    await tx.query('SELECT pg_notify($1, $2)', [DELIVERY_CHANNEL, `webhook:${webhookId}`]);
    return rows.map((r) => ({ job_id: jobId, event_type: r.event_type, previous_status: r.status, attempts: r.attempts }));
  });
}

/**
 * Recover (Svix's recover): every delivery to the destination that was given up (status failed) and whose
 * event entered the outbox at or after `since` becomes pending and due now. Returns how many.
 */
export async function recoverDeliveries(sql: Sql, webhookId: number, since: Date): Promise<number> {
  return sql.transaction(async (tx) => {
    const { rowCount } = await tx.query(
      `UPDATE webhook_deliveries SET status = 'pending', finished_at = NULL, next_attempt_at = now()
        WHERE webhook_endpoint_id = $1 AND status = 'failed' AND enqueued_at >= $2`,
      [webhookId, since],
    );
    if (rowCount > 0) await tx.query('SELECT pg_notify($1, $2)', [DELIVERY_CHANNEL, `webhook:${webhookId}`]);
    return rowCount;
  });
}
