// The dashboard's live numbers through the public API: every pool's in-flight, queued and effective limit
// now, with the last minute's admitted / 429 / 504 / 5xx (GET /api/v1/metrics/live), and one pool's
// per-minute rollups over the last hour or day (GET /api/v1/pools/{pool}/metrics/minutes).
import { Type, type Static } from '@sinclair/typebox';
import { actorOf, requireAbility } from './auth.js';
import type { ControlContext, LiveSource, TypedApp } from './context.js';
import { notFound } from './errors.js';
import { findPool, listPools } from '../store/pools.js';
import { minuteRollups } from '../store/metrics.js';

const Count = Type.Integer({ minimum: 0 });
// Percentiles come from fixed buckets (1, 2, 5, 10, … 60000 ms), interpolated inside the bucket.
const Ms = (description: string) => Type.Union([Type.Number({ minimum: 0 }), Type.Null()], { description });

export const PoolLive = Type.Object(
  {
    pool_id: Type.Integer(),
    subdomain: Type.String(),
    name: Type.String(),
    backend: Type.String(),
    max_concurrent: Type.Integer(),
    reporting: Type.Boolean({ description: 'false when no data plane runs in the Control API\'s process; the live fields are then null' }),
    in_flight: Type.Union([Count, Type.Null()]),
    queued: Type.Union([Count, Type.Null()]),
    effective_limit: Type.Union([Count, Type.Null()]),
    last_minute: Type.Union([
      Type.Object({ admitted: Count, status_429: Count, status_504: Count, status_5xx: Count }, { additionalProperties: false }),
      Type.Null(),
    ]),
  },
  { $id: 'PoolLive', additionalProperties: false },
);
type PoolLiveT = Static<typeof PoolLive>;

export const MinuteRollup = Type.Object(
  {
    minute: Type.String({ format: 'date-time' }),
    requests: Count,
    admitted: Count,
    queued: Count,
    rejected: Count,
    upstream_errors: Type.Integer({ minimum: 0, description: 'Admitted requests whose upstream failed (connection error, timeout)' }),
    queue_wait_p50_ms: Ms('Median queue wait of the minute\'s admitted requests; null when none'),
    queue_wait_p95_ms: Ms('95th percentile queue wait; null when none'),
    upstream_p50_ms: Ms('Median upstream latency of the minute\'s forwarded requests; null when none'),
    upstream_p95_ms: Ms('95th percentile upstream latency; null when none'),
    effective_limit: Type.Union([Count, Type.Null()], { description: 'Lowest effective limit sampled in the minute; null when not sampled' }),
  },
  { $id: 'MinuteRollup', additionalProperties: false },
);

const CAUSES = ['latency_gradient', 'growth', 'status_429', 'throttled', 'rate_headers', 'probe', 'probe_end'] as const;

/** Issue 26 item 4: why the effective limit is below max_concurrent, with the adaptive limit's last moves. */
const PoolLimit = Type.Object(
  {
    max_concurrent: Type.Integer(),
    adaptive: Type.Boolean({ description: 'the pool\'s adaptive setting' }),
    adaptive_min: Type.Integer({ description: 'the floor the adaptive limit never goes below' }),
    reporting: Type.Boolean({ description: 'false when no data plane runs in the Control API\'s process; the learned fields are then null' }),
    effective_limit: Type.Union([Count, Type.Null()], { description: 'the limit enforced now' }),
    probing: Type.Boolean({ description: 'a probe has lowered the limit for a moment to measure latency without load' }),
    short_rtt_ms: Type.Union([Type.Number(), Type.Null()], { description: 'recent upstream latency the adaptive limit works from' }),
    long_rtt_ms: Type.Union([Type.Number(), Type.Null()], { description: 'long-term (no-load) upstream latency' }),
    adjustments: Type.Array(
      Type.Object(
        {
          time: Type.String({ format: 'date-time' }),
          from: Count,
          to: Count,
          cause: Type.Union(CAUSES.map((c) => Type.Literal(c)), {
            description: 'latency_gradient: recent latency rose above the long-term latency; growth: latency held while the pool was busy; ' +
              'status_429, throttled, rate_headers: the upstream refused for load (a 429, a lock client\'s throttled count, Retry-After or rate headers); ' +
              'probe, probe_end: the periodic latency probe',
          }),
          short_rtt_ms: Type.Number(),
          long_rtt_ms: Type.Number(),
        },
        { additionalProperties: false },
      ),
      { description: 'the last adjustments in this process, newest first (up to 20)' },
    ),
  },
  { additionalProperties: false },
);
type PoolLimitT = Static<typeof PoolLimit>;

/** What the pool page and `admin pool show` say about a pool's effective limit. */
export function poolLimitView(pool: { id: number; max_concurrent: number; settings: Record<string, unknown> }, source: LiveSource | null): PoolLimitT {
  const adaptive = pool.settings.adaptive !== false;
  const learned = source?.learned?.(pool.id) ?? null;
  const round = (ms: number) => (ms > 0 ? Math.round(ms * 10) / 10 : null);
  return {
    max_concurrent: pool.max_concurrent,
    adaptive,
    adaptive_min: typeof pool.settings.adaptiveMin === 'number' ? pool.settings.adaptiveMin : 1,
    reporting: source !== null,
    effective_limit: source ? (learned?.effectiveLimit ?? source.state(pool.id).effectiveLimit) : null,
    probing: learned?.probing ?? false,
    short_rtt_ms: learned ? round(learned.shortRttMs) : null,
    long_rtt_ms: learned ? round(learned.longRttMs) : null,
    adjustments: (learned?.adjustments ?? []).map((a) => ({
      time: new Date(a.at).toISOString(), from: a.from, to: a.to, cause: a.cause, short_rtt_ms: round(a.shortRttMs) ?? 0, long_rtt_ms: round(a.longRttMs) ?? 0,
    })).reverse(),
  };
}

const WINDOWS = { '1h': 3_600_000, '24h': 86_400_000 } as const;
const MinutesQuery = Type.Object(
  { window: Type.Optional(Type.Union([Type.Literal('1h'), Type.Literal('24h')], { default: '1h' })) },
  { additionalProperties: false },
);
const PoolParams = Type.Object({ pool: Type.String({ minLength: 1, maxLength: 63 }) });

export function liveRoutes(app: TypedApp, ctx: ControlContext): void {
  app.get(
    '/api/v1/metrics/live',
    {
      schema: {
        tags: ['metrics'],
        summary: 'Every pool\'s in-flight, queued and effective limit now, and the last minute\'s admitted / 429 / 504 / 5xx',
        description: 'Extension of the service spec (the dashboard\'s Pools page). Needs metrics:read. The numbers are those of the data plane in this process.',
        response: { 200: Type.Object({ data: Type.Array(Type.Ref('PoolLive')) }, { additionalProperties: false }), 403: Type.Ref('Error') },
      },
    },
    async (req) => {
      const actor = requireAbility(req, 'metrics:read');
      const source = ctx.live?.source ?? null;
      const data: PoolLiveT[] = (await listPools(ctx.sql, actor.teamId)).map((p) => {
        const base = { pool_id: p.id, subdomain: p.subdomain, name: p.name, backend: p.backend, max_concurrent: p.max_concurrent };
        if (!source) return { ...base, reporting: false, in_flight: null, queued: null, effective_limit: null, last_minute: null };
        const s = source.state(p.id);
        return { ...base, reporting: true, in_flight: s.inFlight, queued: s.queued, effective_limit: s.effectiveLimit, last_minute: source.lastMinute(p.id) };
      });
      return { data };
    },
  );

  app.get(
    '/api/v1/pools/:pool/limit',
    {
      schema: {
        tags: ['metrics'],
        summary: 'A pool\'s effective limit and why: max_concurrent, the adaptive floor, the learned latencies and the adaptive limit\'s last adjustments with their cause',
        description: 'Extension of the service spec (the dashboard\'s Pool page, `poolgate admin pool show`). Needs metrics:read. The numbers are those of the data plane in this process.',
        params: PoolParams,
        response: { 200: Type.Object({ data: PoolLimit }, { additionalProperties: false }), 403: Type.Ref('Error'), 404: Type.Ref('Error') },
      },
      preValidation: async (req) => {
        requireAbility(req, 'metrics:read');
      },
    },
    async (req) => {
      const actor = actorOf(req);
      const pool = await findPool(ctx.sql, actor.teamId, req.params.pool);
      if (!pool) throw notFound('pool');
      return { data: poolLimitView(pool, ctx.live?.source ?? null) };
    },
  );

  app.get(
    '/api/v1/pools/:pool/metrics/minutes',
    {
      schema: {
        tags: ['metrics'],
        summary: 'A pool\'s per-minute rollups (requests by outcome, queue wait and upstream latency p50/p95, effective limit) over the last hour or day, oldest first',
        description: 'Extension of the service spec (the dashboard\'s charts). Needs metrics:read. Minutes without traffic are absent.',
        params: PoolParams,
        querystring: MinutesQuery,
        response: { 200: Type.Object({ data: Type.Array(Type.Ref('MinuteRollup')) }, { additionalProperties: false }), 403: Type.Ref('Error'), 404: Type.Ref('Error'), 422: Type.Ref('Error') },
      },
      preValidation: async (req) => {
        requireAbility(req, 'metrics:read');
      },
    },
    async (req) => {
      const actor = actorOf(req);
      const pool = await findPool(ctx.sql, actor.teamId, req.params.pool);
      if (!pool) throw notFound('pool');
      const from = new Date(ctx.now().getTime() - WINDOWS[req.query.window ?? '1h']);
      const rows = await minuteRollups(ctx.sql, pool.id, from);
      return { data: rows.map((r) => ({ ...r, minute: r.minute.toISOString() })) };
    },
  );
}
