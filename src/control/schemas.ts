// Wire shapes of the Control API (spec: "Resources and their fields"). Each schema validates, types
// the handlers and is published in the OpenAPI document under components.schemas by its $id.
import { Type, type Static, type TSchema } from '@sinclair/typebox';

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

export const ABILITIES = ['budgets:read', 'pools:read', 'pools:write', 'keys:write', 'metrics:read'] as const;
export type Ability = (typeof ABILITIES)[number];

export const Me = Type.Object(
  { user: Type.Ref('User'), team: Type.Ref('Team'), abilities: Type.Array(Type.String()) },
  { $id: 'Me', additionalProperties: false },
);

export const Budget = Type.Object(
  {
    id: Type.Integer(),
    name: Type.String(),
    pool_ids: Type.Array(Type.Integer()),
    origin_max_concurrent: Nullable(Type.Integer()),
    unallocated: Type.Integer(),
  },
  { $id: 'Budget', additionalProperties: false },
);

export const PoolBudget = Type.Object(
  { id: Type.Integer(), name: Type.String(), reserved_concurrent: Type.Integer() },
  { $id: 'PoolBudget', additionalProperties: false },
);

export const BACKENDS = ['http', 'postgres', 'mysql'] as const;

export const Pool = Type.Object(
  {
    id: Type.Integer(),
    name: Type.String(),
    description: Type.Optional(Nullable(Type.String())),
    subdomain: Type.String(),
    backend: Type.Union(BACKENDS.map((b) => Type.Literal(b))),
    max_concurrent: Type.Integer(),
    require_key: Type.Boolean(),
    has_credential: Type.Boolean(),
    budget: Type.Optional(Nullable(Type.Ref('PoolBudget'))),
  },
  { $id: 'Pool', additionalProperties: false },
);

export const HTTP_METHODS = ['GET', 'HEAD', 'OPTIONS', 'POST', 'PUT', 'PATCH', 'DELETE'] as const;

export const PoolKey = Type.Object(
  {
    id: Type.Integer(),
    label: Type.String(),
    last_four: Type.String(),
    access: Type.Union([Type.Literal('read'), Type.Literal('write')]),
    allowed_methods: Type.Array(Type.String()),
    read_paths: Type.Optional(Type.Record(Type.String(), Type.Array(Type.String()))),
    expires_at: Type.Optional(Nullable(DateTime)),
    revoked_at: Type.Optional(Nullable(DateTime)),
    created_at: Type.Optional(Nullable(DateTime)),
    key: Type.Optional(Type.String()),
    signing_secret: Type.Optional(Type.String()),
  },
  { $id: 'PoolKey', additionalProperties: false },
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

export const AUTH_METHODS = ['bearer_static', 'api_key', 'basic', 'postgres_role'] as const;
export type AuthMethod = (typeof AUTH_METHODS)[number];

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

export type PoolT = Static<typeof Pool>;
export type PoolKeyT = Static<typeof PoolKey>;
export type BudgetT = Static<typeof Budget>;
export type WebhookEndpointT = Static<typeof WebhookEndpoint>;
export type PoolWebhooksT = Static<typeof PoolWebhooks>;
export type WebhookReplayT = Static<typeof WebhookReplay>;
export type WebhookRecoverT = Static<typeof WebhookRecover>;
export type AuthHandoffT = Static<typeof AuthHandoff>;
export type PoolMetricsSummaryT = Static<typeof PoolMetricsSummary>;
