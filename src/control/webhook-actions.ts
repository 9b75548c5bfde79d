// The dashboard's webhook actions through the public API: Re-enable a deactivated destination (spec:
// "Re-enable action on the dashboard details page") and read its delivery history, filtered by result.
import { Type } from '@sinclair/typebox';
import { DataOf } from './schemas.js';
import { requireAbility, requireManager } from './auth.js';
import type { ControlContext, TypedApp } from './context.js';
import { notFound } from './errors.js';
import { writeAndProject } from './webhooks.js';
import { findWebhook, webhookView } from '../store/webhooks.js';

const WebhookParams = Type.Object({ webhookEndpoint: Type.Integer({ minimum: 1, maximum: 2147483647 }) });

export const DeliveryAttempt = Type.Object(
  {
    time: Type.String({ format: 'date-time' }),
    job_id: Type.String(),
    pool_id: Type.Union([Type.Integer(), Type.Null()]),
    pool: Type.Union([Type.String(), Type.Null()]),
    result: Type.Union([Type.Literal('success'), Type.Literal('failure')]),
    http_status: Type.Union([Type.Integer(), Type.Null()]),
    error: Type.Union([Type.String(), Type.Null()]),
    attempt: Type.Integer(),
    latency_ms: Type.Integer(),
  },
  { $id: 'DeliveryAttempt', additionalProperties: false },
);

const HistoryQuery = Type.Object(
  {
    result: Type.Optional(Type.Union([Type.Literal('success'), Type.Literal('failure')])),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 500, default: 100 })),
  },
  { additionalProperties: false },
);

export function webhookActionRoutes(app: TypedApp, ctx: ControlContext): void {
  app.post(
    '/api/v1/webhooks/:webhookEndpoint/enable',
    {
      schema: {
        tags: ['webhooks'],
        summary: 'Re-enable a destination: active again with its failure streak reset, so deliveries resume',
        description: 'Extension of the service spec (its "Re-enable action on the dashboard details page"). Needs pools:write, owner or admin.',
        params: WebhookParams,
        response: { 200: DataOf('WebhookEndpoint'), 403: Type.Ref('Error'), 404: Type.Ref('Error'), 503: Type.Ref('Error') },
      },
    },
    async (req) => {
      const actor = requireAbility(req, 'pools:write');
      requireManager(actor);
      const row = await writeAndProject(ctx, 'edge projection failed, destination unchanged', async (tx, project) => {
        const found = await findWebhook(tx, actor.teamId, req.params.webhookEndpoint, true);
        if (!found) throw notFound('webhook destination');
        await tx.query(
          'UPDATE webhook_endpoints SET disabled = false, consecutive_failures = 0, updated_at = now() WHERE team_id = $1 AND id = $2',
          [actor.teamId, found.id],
        );
        const enabled = (await findWebhook(tx, actor.teamId, found.id))!;
        // The deliverer and the data plane learn of it at once. The data plane's snapshot holds no destinations,
        // only each pool's "has an active destination": its attached pools are reloaded, so they go async again.
        await project(`webhook:${found.id}`);
        for (const poolId of enabled.pool_ids) await project(`pool:${poolId}`);
        return enabled;
      });
      return { data: webhookView(row) };
    },
  );

  app.get(
    '/api/v1/webhooks/:webhookEndpoint/deliveries',
    {
      schema: {
        tags: ['webhooks'],
        summary: 'Delivery attempts of a destination, newest first, optionally only successes or failures',
        description: 'Extension of the service spec (delivery history). Needs pools:read.',
        params: WebhookParams,
        querystring: HistoryQuery,
        response: { 200: Type.Object({ data: Type.Array(Type.Ref('DeliveryAttempt')) }, { additionalProperties: false }), 403: Type.Ref('Error'), 404: Type.Ref('Error'), 422: Type.Ref('Error') },
      },
      preValidation: async (req) => {
        requireAbility(req, 'pools:read');
      },
    },
    async (req) => {
      const actor = requireAbility(req, 'pools:read');
      const hook = await findWebhook(ctx.sql, actor.teamId, req.params.webhookEndpoint);
      if (!hook) throw notFound('webhook destination');
      const { rows } = await ctx.sql.query<{ attempted_at: Date; job_id: string; pool_id: number | null; pool: string | null; result: 'success' | 'failure'; http_status: number | null; error: string | null; attempt: number; latency_ms: number }>(
        `SELECT a.attempted_at, a.job_id, a.pool_id, p.subdomain AS pool, a.result, a.http_status, a.error, a.attempt, a.latency_ms
           FROM webhook_delivery_attempts a LEFT JOIN pools p ON p.id = a.pool_id
          WHERE a.webhook_endpoint_id = $1 AND ($2::text IS NULL OR a.result = $2)
          ORDER BY a.attempted_at DESC, a.id DESC LIMIT $3`,
        [hook.id, req.query.result ?? null, req.query.limit ?? 100],
      );
      return { data: rows.map(({ attempted_at, ...r }) => ({ time: new Date(attempted_at).toISOString(), ...r })) };
    },
  );
}
