// GET /api/v1/pools/:pool/metrics: admit and queue summary of a pool over a range, clamped to retention.
import { Type } from '@sinclair/typebox';
import type { PoolMetricsSummaryT } from './schemas.js';
import { actorOf, requireAbility } from './auth.js';
import type { ControlContext, TypedApp } from './context.js';
import { notFound, unprocessable } from './errors.js';
import { findPool } from '../store/pools.js';
import { sumRollups } from '../store/metrics.js';

const DAY_MS = 86_400_000;

const PoolParams = Type.Object({ pool: Type.String({ minLength: 1, maxLength: 63 }) });
// Unknown query parameters are refused: a misspelt `from` silently widening the range would mislead.
const MetricsQuery = Type.Object(
  {
    from: Type.Optional(Type.String({ format: 'date-time' })),
    to: Type.Optional(Type.String({ format: 'date-time' })),
  },
  { additionalProperties: false },
);

function parseInstant(name: string, value: string | undefined): Date | null {
  if (value === undefined) return null;
  const ms = Date.parse(value);
  // The date-time format admits a leap second (…:60) that Date cannot represent.
  if (Number.isNaN(ms)) throw unprocessable(`querystring.${name} is not a valid date-time`);
  return new Date(ms);
}

/**
 * The range as applied: bounds before the retention start move up to it (clamped). An absent bound
 * stays null (open) and is not clamping, though the sums never reach past retention either way.
 */
export function applyRange(from: Date | null, to: Date | null, now: Date, retentionDays: number) {
  if (from && to && from.getTime() > to.getTime()) throw unprocessable('querystring.from must not be after querystring.to');
  const retentionStart = new Date(now.getTime() - retentionDays * DAY_MS);
  let clamped = false;
  const clamp = (d: Date | null): Date | null => {
    if (d === null || d.getTime() >= retentionStart.getTime()) return d;
    clamped = true;
    return retentionStart;
  };
  const appliedFrom = clamp(from);
  const appliedTo = clamp(to);
  return { from: appliedFrom, to: appliedTo, clamped, lowerBound: appliedFrom ?? retentionStart };
}

export function metricsRoutes(app: TypedApp, ctx: ControlContext): void {
  app.get(
    '/api/v1/pools/:pool/metrics',
    {
      schema: {
        tags: ['metrics'],
        summary: 'Admit, queue and request totals of a pool over [from, to), clamped to retention',
        params: PoolParams,
        querystring: MetricsQuery,
        response: { 200: Type.Ref('PoolMetricsSummary'), 403: Type.Ref('Error'), 404: Type.Ref('Error'), 422: Type.Ref('Error') },
      },
      // Ability first, so a token without metrics:read learns nothing from validation errors.
      preValidation: async (req) => {
        requireAbility(req, 'metrics:read');
      },
    },
    async (req): Promise<PoolMetricsSummaryT> => {
      const actor = actorOf(req);
      const from = parseInstant('from', req.query.from);
      const to = parseInstant('to', req.query.to);
      const retentionDays = ctx.config.metricsRetentionDays;
      const range = applyRange(from, to, ctx.now(), retentionDays);
      const pool = await findPool(ctx.sql, actor.teamId, req.params.pool);
      if (!pool) throw notFound('pool');
      const totals = await sumRollups(ctx.sql, pool.id, range.lowerBound, range.to);
      return {
        pool_id: pool.id,
        requests: totals.requests,
        admitted: totals.admitted,
        admit_rate: totals.requests === 0 ? 0 : totals.admitted / totals.requests,
        queued_count: totals.queued,
        queued_pct: totals.requests === 0 ? 0 : (100 * totals.queued) / totals.requests,
        range: {
          from: range.from?.toISOString() ?? null,
          to: range.to?.toISOString() ?? null,
          retention_days: retentionDays,
          clamped: range.clamped,
        },
      };
    },
  );
}
