// Capacity budgets (read only through the API; created and attached with `poolgate admin budget …`).
import { Type } from '@sinclair/typebox';
import type { BudgetT } from './schemas.js';
import { DataListOf, DataOf } from './schemas.js';
import { requireAbility } from './auth.js';
import type { ControlContext, TypedApp } from './context.js';
import { notFound } from './errors.js';
import { listPools, poolView } from '../store/pools.js';
import type { Queryable } from '../store/sql.js';

const BudgetParams = Type.Object({ budget: Type.Integer({ minimum: 1, maximum: 2147483647 }) });

interface BudgetRow { id: number; name: string; origin_max_concurrent: number | null; pool_ids: number[]; reserved: number }

async function loadBudgets(db: Queryable, teamId: number, id?: number): Promise<BudgetT[]> {
  const { rows } = await db.query<BudgetRow>(
    `SELECT b.id, b.name, b.origin_max_concurrent,
            COALESCE(array_agg(bp.pool_id ORDER BY bp.pool_id) FILTER (WHERE bp.pool_id IS NOT NULL), '{}') AS pool_ids,
            COALESCE(sum(bp.reserved_concurrent), 0)::int AS reserved
       FROM budgets b LEFT JOIN budget_pools bp ON bp.budget_id = b.id
      WHERE b.team_id = $1 ${id === undefined ? '' : 'AND b.id = $2'}
      GROUP BY b.id ORDER BY b.id`,
    id === undefined ? [teamId] : [teamId, id],
  );
  return rows.map((r) => ({
    id: r.id,
    name: r.name,
    pool_ids: r.pool_ids,
    origin_max_concurrent: r.origin_max_concurrent,
    // Unallocated = origin max − Σ reserved; a budget with no origin max has nothing to lend.
    unallocated: r.origin_max_concurrent === null ? 0 : Math.max(0, r.origin_max_concurrent - r.reserved),
  }));
}

export function budgetRoutes(app: TypedApp, ctx: ControlContext): void {
  app.get(
    '/api/v1/budgets',
    { schema: { tags: ['budgets'], summary: 'Budgets granted to the token', response: { 200: DataListOf('Budget') } } },
    async (req) => {
      const actor = requireAbility(req, 'budgets:read');
      return { data: await loadBudgets(ctx.sql, actor.teamId) };
    },
  );

  app.get(
    '/api/v1/budgets/:budget',
    { schema: { tags: ['budgets'], summary: 'One budget', params: BudgetParams, response: { 200: DataOf('Budget'), 404: Type.Ref('Error') } } },
    async (req) => {
      const actor = requireAbility(req, 'budgets:read');
      const [budget] = await loadBudgets(ctx.sql, actor.teamId, req.params.budget);
      if (!budget) throw notFound('budget');
      return { data: budget };
    },
  );

  app.get(
    '/api/v1/budgets/:budget/pools',
    { schema: { tags: ['budgets'], summary: 'Pools in a budget', params: BudgetParams, response: { 200: DataListOf('Pool'), 404: Type.Ref('Error') } } },
    async (req) => {
      const actor = requireAbility(req, 'pools:read');
      const { rows } = await ctx.sql.query('SELECT 1 FROM budgets WHERE id = $1 AND team_id = $2', [req.params.budget, actor.teamId]);
      if (rows.length === 0) throw notFound('budget');
      return { data: (await listPools(ctx.sql, actor.teamId, req.params.budget)).map(poolView) };
    },
  );
}
