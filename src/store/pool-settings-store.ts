// Reading and changing one pool's settings (the pools columns plus the settings jsonb) as one unit:
// the whole patch is validated first, then written in one transaction that also notifies `pool:<id>`.
import { checkSettings, resolvePoolSettings, SettingsError, type PoolColumns, type PoolSettings } from './pool-settings.js';
import { CHANGE_CHANNEL, type Queryable, type Sql } from './sql.js';

export interface SettingsPatch {
  max_concurrent?: number;
  require_key?: boolean;
  async_enabled?: boolean;
  async_on_queue?: boolean;
  /** Keys to change; a key set to null goes back to its default. */
  settings?: Record<string, unknown>;
}

export interface PoolSettingsView extends PoolColumns {
  pool_id: number;
  subdomain: string;
  /** Every setting in force, defaults included. */
  settings: PoolSettings;
}

/** Async mode is plan-gated (spec: Limits, async admission). */
const ASYNC_PLANS = new Set(['team', 'business']);

interface Row extends PoolColumns {
  id: number;
  subdomain: string;
  settings: Record<string, unknown> | null;
  plan: string;
}

const SELECT = `SELECT p.id, p.subdomain, p.max_concurrent, p.require_key, p.async_enabled, p.async_on_queue, p.settings, t.plan
                  FROM pools p JOIN teams t ON t.id = p.team_id
                 WHERE p.team_id = $1 AND p.subdomain = $2 AND p.status <> 'deleted'`;

function view(row: Row, settings: PoolSettings): PoolSettingsView {
  return {
    pool_id: row.id,
    subdomain: row.subdomain,
    max_concurrent: row.max_concurrent,
    require_key: row.require_key,
    async_enabled: row.async_enabled,
    async_on_queue: row.async_on_queue,
    settings,
  };
}

function explicitOf(stored: unknown): Record<string, unknown> {
  return stored && typeof stored === 'object' && !Array.isArray(stored) ? { ...(stored as Record<string, unknown>) } : {};
}

/** The settings of a pool of the team; null when the team has no such pool. */
export async function readPoolSettings(db: Queryable, teamId: number, subdomain: string): Promise<PoolSettingsView | null> {
  const { rows } = await db.query<Row>(SELECT, [teamId, subdomain.toLowerCase()]);
  const row = rows[0];
  if (!row) return null;
  let settings: PoolSettings;
  try {
    settings = checkSettings(explicitOf(row.settings), row, { allowHttpJwks: true });
  } catch {
    // Only a hand edit of the row gets here; show what the data plane would apply.
    settings = resolvePoolSettings(row.settings);
  }
  return view(row, settings);
}

/**
 * Applies a patch to a pool of the team, or changes nothing: null when the pool is not the team's,
 * SettingsError when the result would not be valid. The row is locked while the patch is checked.
 */
export async function patchPoolSettings(
  sql: Sql,
  teamId: number,
  subdomain: string,
  patch: SettingsPatch,
  opts: { allowHttpJwks: boolean },
): Promise<PoolSettingsView | null> {
  return sql.transaction(async (tx) => {
    const { rows } = await tx.query<Row>(`${SELECT} FOR UPDATE OF p`, [teamId, subdomain.toLowerCase()]);
    const row = rows[0];
    if (!row) return null;
    const explicit = explicitOf(row.settings);
    for (const [k, v] of Object.entries(patch.settings ?? {})) {
      if (v === null) delete explicit[k];
      else explicit[k] = v;
    }
    const columns: PoolColumns = {
      max_concurrent: patch.max_concurrent ?? row.max_concurrent,
      require_key: patch.require_key ?? row.require_key,
      async_enabled: patch.async_enabled ?? row.async_enabled,
      async_on_queue: patch.async_on_queue ?? row.async_on_queue,
    };
    const settings = checkSettings(explicit, columns, opts);
    if (columns.async_enabled && !row.async_enabled && !ASYNC_PLANS.has(row.plan)) {
      throw new SettingsError(`async_enabled: async pools need the Team or Business plan; this organization is on the ${row.plan} plan`);
    }
    await tx.query(
      `UPDATE pools SET max_concurrent = $2, require_key = $3, async_enabled = $4, async_on_queue = $5, settings = $6::jsonb, updated_at = now()
        WHERE id = $1`,
      [row.id, columns.max_concurrent, columns.require_key, columns.async_enabled, columns.async_on_queue, JSON.stringify(explicit)],
    );
    // Delivered on commit only, so the data plane never sees a change that rolled back.
    await tx.query('SELECT pg_notify($1, $2)', [CHANGE_CHANNEL, `pool:${row.id}`]);
    return view({ ...row, ...columns }, settings);
  });
}

