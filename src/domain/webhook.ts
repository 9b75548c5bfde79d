// Webhook endpoints and a pool's subscription to them (spec: "Webhooks").
import { Type, type Static, type TSchema } from '@sinclair/typebox';

const Nullable = <T extends TSchema>(s: T) => Type.Union([s, Type.Null()]);

export const WebhookEndpoint = Type.Object(
  {
    id: Type.Integer(),
    name: Type.String(),
    description: Type.Optional(Nullable(Type.String())),
    url: Type.String(),
    disabled: Type.Boolean(),
    pool_ids: Type.Array(Type.Integer()),
    signing_secret: Type.Optional(Type.String({ pattern: '^whsec_' })),
    async_enabled_on_pool_ids: Type.Optional(Type.Array(Type.Integer())),
  },
  { $id: 'WebhookEndpoint', additionalProperties: false },
);

export const PoolWebhooks = Type.Object(
  {
    pool_id: Type.Integer(),
    subdomain: Type.String(),
    webhook_endpoint_ids: Type.Array(Type.Integer()),
    async_enabled: Type.Boolean(),
    async_on_queue: Type.Boolean(),
  },
  { $id: 'PoolWebhooks', additionalProperties: false },
);

export type WebhookEndpointT = Static<typeof WebhookEndpoint>;
export type PoolWebhooksT = Static<typeof PoolWebhooks>;
