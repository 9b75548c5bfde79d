// Wire shapes of the Control API (spec: "Resources and their fields"). Each schema validates, types
// the handlers and is published in the OpenAPI document under components.schemas by its $id.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
// The domain's shapes live in src/domain/; the API layer re-exports them for its routes.
export { ABILITIES, type Ability } from '../domain/abilities.js';
export { Budget, type BudgetT } from '../domain/budget.js';
export { AUTH_METHODS, type AuthMethod } from '../domain/credential.js';
export { BACKENDS, HTTP_METHODS, Pool, PoolBudget, PoolKey, type PoolKeyT, type PoolT } from '../domain/pool.js';
export { PoolWebhooks, WebhookEndpoint, type PoolWebhooksT, type WebhookEndpointT } from '../domain/webhook.js';
import { Budget } from '../domain/budget.js';
import { Pool, PoolBudget, PoolKey } from '../domain/pool.js';
import { PoolWebhooks, WebhookEndpoint } from '../domain/webhook.js';

const Nullable = <T extends TSchema>(s: T) => Type.Union([s, Type.Null()]);
const DateTime = Type.String({ format: 'date-time' });

export const ErrorBody = Type.Object({ message: Type.String() }, { $id: 'Error', additionalProperties: false });

export const User = Type.Object(
  { id: Type.Integer(), name: Type.String(), email: Type.String({ format: 'email' }) },
  { $id: 'User', additionalProperties: false },
);

export const Team = Type.Object(
  { id: Type.Integer(), name: Type.String(), slug: Type.String() },
  { $id: 'Team', additionalProperties: false },
);

export const Me = Type.Object(
  { user: Type.Ref('User'), team: Type.Ref('Team'), abilities: Type.Array(Type.String()) },
  { $id: 'Me', additionalProperties: false },
);

export const MetricsRange = Type.Object(
  {
    from: Nullable(DateTime),
    to: Nullable(DateTime),
    retention_days: Type.Integer(),
    clamped: Type.Boolean(),
  },
  { $id: 'MetricsRange', additionalProperties: false },
);

export const PoolMetricsSummary = Type.Object(
  {
    pool_id: Type.Integer(),
    requests: Type.Integer(),
    admitted: Type.Integer(),
    admit_rate: Type.Number(),
    queued_count: Type.Integer(),
    queued_pct: Type.Number(),
    range: Type.Ref('MetricsRange'),
  },
  { $id: 'PoolMetricsSummary', additionalProperties: false },
);

/** Beyond the spec: a replayed delivery (Svix's resend). */
export const WebhookReplay = Type.Object(
  {
    webhook_endpoint_id: Type.Integer(),
    job_id: Type.String(),
    event_type: Type.String(),
    previous_status: Type.Union([Type.Literal('pending'), Type.Literal('delivered'), Type.Literal('failed')]),
    attempts: Type.Integer({ description: 'attempts made before the replay; the replay is the next one' }),
  },
  { $id: 'WebhookReplay', additionalProperties: false },
);

/** Beyond the spec: failed deliveries made pending again (Svix's recover). */
export const WebhookRecover = Type.Object(
  {
    webhook_endpoint_id: Type.Integer(),
    since: DateTime,
    recovered: Type.Integer({ description: 'given-up deliveries queued again' }),
  },
  { $id: 'WebhookRecover', additionalProperties: false },
);

export const AuthHandoff = Type.Object(
  {
    pool: Type.Ref('Pool'),
    pool_created: Type.Optional(Type.Boolean()),
    custody_flipped: Type.Optional(Type.Boolean()),
    already_attached: Type.Boolean(),
    auth_method: Type.String(),
    intake_url: Type.Optional(Nullable(Type.String())),
    intake_token: Type.Optional(Nullable(Type.String())),
    dashboard_url: Type.String(),
    expires_at: Type.Optional(Nullable(DateTime)),
    required_fields: Type.Optional(Type.Array(Type.String())),
    auth_posture: Type.Optional(Type.String()),
    next: Type.Optional(Type.String()),
  },
  { $id: 'AuthHandoff', additionalProperties: false },
);

/** Every shared schema, registered once with fastify (validation, serialisation, OpenAPI components). */
export const sharedSchemas: TSchema[] = [
  ErrorBody,
  User,
  Team,
  Me,
  Budget,
  PoolBudget,
  Pool,
  PoolKey,
  MetricsRange,
  PoolMetricsSummary,
  WebhookEndpoint,
  PoolWebhooks,
  WebhookReplay,
  WebhookRecover,
  AuthHandoff,
];

/** `{ data: T }` envelope of single resources and collections. */
export const DataOf = (ref: string) => Type.Object({ data: Type.Ref(ref) }, { additionalProperties: false });
export const DataListOf = (ref: string) => Type.Object({ data: Type.Array(Type.Ref(ref)) }, { additionalProperties: false });

export type WebhookReplayT = Static<typeof WebhookReplay>;
export type WebhookRecoverT = Static<typeof WebhookRecover>;
export type AuthHandoffT = Static<typeof AuthHandoff>;
export type PoolMetricsSummaryT = Static<typeof PoolMetricsSummary>;
