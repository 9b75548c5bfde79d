// Per-pool settings kept in pools.settings (jsonb). The spec creates pools "with default settings" and
// leaves them to the dashboard; these are the settings every part reads, with their documented defaults.
import { Type, type Static } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';

const Method = Type.String({ pattern: '^[A-Z]{1,20}$' });

export const PoolSettingsSchema = Type.Object(
  {
    /** Longest wait for a slot in the queue; X-Service-Queue-Timeout-Ms and lock waitMs are clamped to it. */
    queueTimeoutMs: Type.Integer({ minimum: 0, maximum: 600_000, default: 30_000 }),
    /** Waiters beyond this are refused at once with 429. */
    queueLength: Type.Integer({ minimum: 0, maximum: 100_000, default: 1_000 }),
    /** Upstream request timeout of proxied traffic, and the lock API's request-timeout cap (requestDeadline). */
    requestTimeoutMs: Type.Integer({ minimum: 100, maximum: 3_600_000, default: 60_000 }),
    /** Lock lease term and recommended renew interval. */
    leaseTermMs: Type.Integer({ minimum: 100, maximum: 600_000, default: 30_000 }),
    renewIntervalMs: Type.Integer({ minimum: 50, maximum: 600_000, default: 10_000 }),
    /** Whether `Authorization: Bearer <pool key>` is accepted besides X-Service-Key. */
    allowBearerKey: Type.Boolean({ default: true }),
    /** Extra methods a `read` key admits besides GET, HEAD, OPTIONS (e.g. POST for a search API). */
    readMethods: Type.Array(Method, { maxItems: 16, default: [] }),
    /** Optional path-prefix restriction per extra read method (reported as PoolKey.read_paths). */
    readPaths: Type.Record(Method, Type.Array(Type.String({ minLength: 1, maxLength: 500, pattern: '^/' }), { maxItems: 64 }), { default: {} }),
    /** Adaptive concurrency on/off and the floor it never goes under. */
    adaptive: Type.Boolean({ default: true }),
    adaptiveMin: Type.Integer({ minimum: 1, maximum: 100_000, default: 1 }),
    /** A fixed requests-per-minute gate; null lets the RPM learner decide. */
    rpmOverride: Type.Union([Type.Integer({ minimum: 1, maximum: 10_000_000 }), Type.Null()], { default: null }),
    /** Async job time-to-live before it expires unrun. */
    jobTtlMs: Type.Integer({ minimum: 1_000, maximum: 7 * 86_400_000, default: 3_600_000 }),
    /** Origin signing (HMAC policy): minting a key then returns its signing_secret once. */
    originSigning: Type.Boolean({ default: false }),
  },
  { additionalProperties: false },
);

export type PoolSettings = Readonly<Static<typeof PoolSettingsSchema>>;

export const DEFAULT_POOL_SETTINGS: PoolSettings = Object.freeze(Value.Default(PoolSettingsSchema, {}) as PoolSettings);

/** The stored jsonb merged over the defaults; stored values that no longer validate fall back to defaults. */
export function resolvePoolSettings(stored: unknown): PoolSettings {
  const merged = Value.Default(PoolSettingsSchema, { ...(stored && typeof stored === 'object' ? stored : {}) });
  if (Value.Check(PoolSettingsSchema, merged)) return merged;
  return DEFAULT_POOL_SETTINGS;
}

export const BASE_READ_METHODS = ['GET', 'HEAD', 'OPTIONS'] as const;

/** Methods a key admits (spec: Key access semantics). */
export function allowedMethods(access: 'read' | 'write', settings: PoolSettings): string[] {
  if (access === 'write') return ['GET', 'HEAD', 'OPTIONS', 'POST', 'PUT', 'PATCH', 'DELETE'];
  return [...new Set([...BASE_READ_METHODS, ...settings.readMethods])];
}
