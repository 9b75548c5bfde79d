// A pool, its budget share and its keys as every layer sees them (spec: "Resources and their fields").
// Each schema validates and types; the Control API publishes them under components.schemas by $id.
import { Type, type Static, type TSchema } from '@sinclair/typebox';

const Nullable = <T extends TSchema>(s: T) => Type.Union([s, Type.Null()]);
const DateTime = Type.String({ format: 'date-time' });

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

export type PoolT = Static<typeof Pool>;
export type PoolKeyT = Static<typeof PoolKey>;
