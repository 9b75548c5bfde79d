// Pool rows and their Control API view (spec: Pool, with the embedded PoolBudget).
import type { PoolT } from '../domain/pool.js';
import type { Queryable } from './sql.js';

export interface PoolRow {
  id: number;
  team_id: number;
  name: string;
  description: string | null;
  subdomain: string;
  backend: 'http' | 'postgres' | 'mysql';
  origin: string | null;
  origin_host: string | null;
  db_host: string | null;
  db_port: number | null;
  db_name: string | null;
  db_sslmode: string | null;
  max_concurrent: number;
  require_key: boolean;
  auth_method: string | null;
  managed_auth: boolean;
  credential_id: number | null;
  async_enabled: boolean;
  async_on_queue: boolean;
  settings: Record<string, unknown>;
  status: string;
  budget_id: number | null;
  budget_name: string | null;
  reserved_concurrent: number | null;
}

const POOL_SELECT = `
  SELECT p.*, b.id AS budget_id, b.name AS budget_name, bp.reserved_concurrent
    FROM pools p
    LEFT JOIN budget_pools bp ON bp.pool_id = p.id
    LEFT JOIN budgets b ON b.id = bp.budget_id`;

export function poolView(row: PoolRow): PoolT {
  return {
    id: row.id,
    name: row.name,
    description: row.description,
    subdomain: row.subdomain,
    backend: row.backend,
    max_concurrent: row.max_concurrent,
    require_key: row.require_key,
    has_credential: row.credential_id !== null,
    budget:
      row.budget_id !== null
        ? { id: row.budget_id, name: row.budget_name!, reserved_concurrent: row.reserved_concurrent ?? 0 }
        : null,
  };
}

/** A live pool of the team by its subdomain label (another team's pool is simply not found). */
export async function findPool(db: Queryable, teamId: number, subdomain: string): Promise<PoolRow | null> {
  const { rows } = await db.query<PoolRow>(`${POOL_SELECT} WHERE p.team_id = $1 AND p.subdomain = $2 AND p.status <> 'deleted'`, [teamId, subdomain]);
  return rows[0] ?? null;
}

export async function findPoolById(db: Queryable, teamId: number, id: number): Promise<PoolRow | null> {
  const { rows } = await db.query<PoolRow>(`${POOL_SELECT} WHERE p.team_id = $1 AND p.id = $2 AND p.status <> 'deleted'`, [teamId, id]);
  return rows[0] ?? null;
}

export async function listPools(db: Queryable, teamId: number, budgetId?: number): Promise<PoolRow[]> {
  const { rows } = budgetId === undefined
    ? await db.query<PoolRow>(`${POOL_SELECT} WHERE p.team_id = $1 AND p.status <> 'deleted' ORDER BY p.id`, [teamId])
    : await db.query<PoolRow>(`${POOL_SELECT} WHERE p.team_id = $1 AND b.id = $2 AND p.status <> 'deleted' ORDER BY p.id`, [teamId, budgetId]);
  return rows;
}

/**
 * Deletes a live pool of the team (beyond the spec; docs/pools.md): the row stays with status
 * 'deleted' (its subdomain is never given to another pool, its metrics and job history stay readable), its live
 * keys are revoked and its budget attachment dropped, in one transaction. Null when there is no such live pool.
 */
export async function deletePool(db: Queryable, teamId: number, subdomain: string, now: Date): Promise<{ pool: PoolRow; keysRevoked: number[] } | null> {
  const pool = await findPool(db, teamId, subdomain);
  if (!pool) return null;
  await db.query(`UPDATE pools SET status = 'deleted' WHERE id = $1`, [pool.id]);
  const { rows } = await db.query<{ id: number }>(
    `UPDATE pool_keys SET revoked_at = $2 WHERE pool_id = $1 AND revoked_at IS NULL RETURNING id`,
    [pool.id, now],
  );
  await db.query('DELETE FROM budget_pools WHERE pool_id = $1', [pool.id]);
  return { pool, keysRevoked: rows.map((r) => r.id) };
}
