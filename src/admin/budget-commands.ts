// `poolgate admin budget …`: Capacity budgets are created and pools attached to them here (the spec
// puts this in the dashboard); the Control API only reads them.
import { AdminUsageError, intOption, need, teamOf, type Command } from './command.js';
import { findPool } from '../store/pools.js';
import { CHANGE_CHANNEL } from '../store/sql.js';

interface BudgetRow { id: number; name: string; origin_max_concurrent: number | null }

export const budgetCommands: Record<string, Command> = {
  'budget create': {
    usage: 'admin budget create --team TEAM --name NAME [--origin-max N]  (N: concurrency the origin allows across the budget\'s pools)',
    options: { team: { type: 'string' }, name: { type: 'string' }, 'origin-max': { type: 'string' } },
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const name = need(v, 'name');
      const originMax = v['origin-max'] === undefined ? null : intOption(String(v['origin-max']), 'origin-max', 1);
      const { rows } = await deps.sql.query<BudgetRow>(
        `INSERT INTO budgets (team_id, name, origin_max_concurrent) VALUES ($1, $2, $3)
         ON CONFLICT (team_id, name) DO NOTHING RETURNING id, name, origin_max_concurrent`,
        [team.id, name, originMax],
      );
      const budget = rows[0];
      if (!budget) throw new AdminUsageError(`a budget named ${JSON.stringify(name)} already exists in team ${team.slug}`);
      await deps.sql.notify(CHANGE_CHANNEL, `budget:${budget.id}`);
      return { budget: { ...budget, pool_ids: [], unallocated: budget.origin_max_concurrent ?? 0 }, team: { id: team.id, slug: team.slug } };
    },
  },

  'budget attach': {
    usage: 'admin budget attach --team TEAM --budget ID --pool SUBDOMAIN [--reserved N]  (moves the pool if it is in another budget)',
    options: { team: { type: 'string' }, budget: { type: 'string' }, pool: { type: 'string' }, reserved: { type: 'string' } },
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const budgetId = intOption(need(v, 'budget'), 'budget', 1);
      const subdomain = need(v, 'pool').toLowerCase();
      const reserved = v.reserved === undefined ? 0 : intOption(String(v.reserved), 'reserved', 0);

      const out = await deps.sql.transaction(async (tx) => {
        // Locking the budget row serialises attaches to it, so Σ reserved is checked against settled rows.
        const { rows } = await tx.query<BudgetRow>(
          'SELECT id, name, origin_max_concurrent FROM budgets WHERE id = $1 AND team_id = $2 FOR UPDATE',
          [budgetId, team.id],
        );
        const budget = rows[0];
        if (!budget) throw new AdminUsageError(`budget ${budgetId} not found in team ${team.slug}`);
        const pool = await findPool(tx, team.id, subdomain);
        if (!pool) throw new AdminUsageError(`pool ${JSON.stringify(subdomain)} not found in team ${team.slug}`);

        const { rows: sums } = await tx.query<{ reserved: number }>(
          'SELECT COALESCE(sum(reserved_concurrent), 0)::int AS reserved FROM budget_pools WHERE budget_id = $1 AND pool_id <> $2',
          [budget.id, pool.id],
        );
        const others = sums[0]!.reserved;
        if (budget.origin_max_concurrent !== null && others + reserved > budget.origin_max_concurrent) {
          throw new AdminUsageError(
            `--reserved ${reserved} is too much: budget ${budget.id} allows ${budget.origin_max_concurrent} at the origin and ` +
              `its other pools already reserve ${others}, so at most ${budget.origin_max_concurrent - others} is left`,
          );
        }
        // A pool is in at most one budget: attaching moves it.
        const { rows: moved } = await tx.query<{ budget_id: number }>('DELETE FROM budget_pools WHERE pool_id = $1 RETURNING budget_id', [pool.id]);
        await tx.query('INSERT INTO budget_pools (budget_id, pool_id, reserved_concurrent) VALUES ($1, $2, $3)', [budget.id, pool.id, reserved]);
        const from = moved[0]?.budget_id;
        return {
          budget: { id: budget.id, name: budget.name },
          pool: { id: pool.id, subdomain: pool.subdomain },
          reserved_concurrent: reserved,
          moved_from_budget_id: from !== undefined && from !== budget.id ? from : null,
          unallocated: budget.origin_max_concurrent === null ? 0 : budget.origin_max_concurrent - others - reserved,
        };
      });
      await deps.sql.notify(CHANGE_CHANNEL, `budget:${out.budget.id}`);
      if (out.moved_from_budget_id !== null) await deps.sql.notify(CHANGE_CHANNEL, `budget:${out.moved_from_budget_id}`);
      await deps.sql.notify(CHANGE_CHANNEL, `pool:${out.pool.id}`);
      return out;
    },
  },
};
