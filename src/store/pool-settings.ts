// Per-pool settings kept in pools.settings (jsonb). The spec creates pools "with default settings" and
// leaves them to the dashboard; these are the settings every part reads, with their documented defaults.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { parseCidr } from '../domain/cidr.js';
import { importStaticKey } from '../domain/jwt-keys.js';

const Method = Type.String({ pattern: '^[A-Z]{1,20}$' });
const HeaderName = Type.String({ pattern: "^[a-z0-9!#$%&'*+.^_`|~-]{1,64}$" });

/** JWT policy: tokens verified with jose against a JWKS URL or static keys (JWK objects or PEM public keys). */
export const JwtPolicySchema = Type.Object(
  {
    issuer: Type.Optional(Type.String({ minLength: 1, maxLength: 500 })),
    audience: Type.Optional(Type.String({ minLength: 1, maxLength: 500 })),
    jwksUrl: Type.Optional(Type.String({ minLength: 1, maxLength: 2048 })),
    keys: Type.Optional(Type.Array(Type.Union([Type.String({ minLength: 1, maxLength: 16384 }), Type.Record(Type.String(), Type.Unknown())]), { minItems: 1, maxItems: 16 })),
    /** Accepted signing algorithms; absent accepts what the key allows (never `none`). */
    algorithms: Type.Optional(Type.Array(Type.String({ pattern: '^(RS|PS|ES)(256|384|512)$|^EdDSA$|^ES256K$|^HS(256|384|512)$' }), { minItems: 1, maxItems: 12 })),
    /** Claims the token must carry (any value). */
    requiredClaims: Type.Optional(Type.Array(Type.String({ minLength: 1, maxLength: 100 }), { maxItems: 32 })),
    /** Tolerated clock difference for exp/nbf/iat, seconds (default 30). */
    clockSkewSec: Type.Optional(Type.Integer({ minimum: 0, maximum: 600 })),
    /** Header carrying the token (lower case; default `authorization`, as `Bearer <jwt>`). */
    header: Type.Optional(HeaderName),
  },
  { additionalProperties: false },
);
export type JwtPolicy = Static<typeof JwtPolicySchema>;

/** Access-proxy policy: the identity header is trusted only from these proxy addresses; others are refused. */
export const AccessProxyPolicySchema = Type.Object(
  {
    proxies: Type.Array(Type.String({ minLength: 1, maxLength: 64 }), { minItems: 1, maxItems: 64 }),
    /** Header the proxy sets (lower case; default `x-auth-request-user`); forwarded to the origin unless it is an X-Service-* name. */
    header: Type.Optional(HeaderName),
  },
  { additionalProperties: false },
);
export type AccessProxyPolicy = Static<typeof AccessProxyPolicySchema>;

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
    /** Origin signing (HMAC policy): minting a key then returns its signing_secret once, and every request must be signed with it. */
    originSigning: Type.Boolean({ default: false }),
    /** HMAC policy: a signed request's timestamp may be this far from the clock; nonces are remembered as long. */
    signatureWindowSec: Type.Integer({ minimum: 1, maximum: 3600, default: 300 }),
    /** HMAC policy: signed request bodies are buffered (to hash them) up to this many bytes; larger ones get 413. */
    signedBodyLimit: Type.Integer({ minimum: 0, maximum: 16 * 1024 * 1024, default: 1024 * 1024 }),
    /** IP allowlist policy: CIDR ranges (IPv4, IPv6) a client address must be in; empty admits every address. */
    ipAllowlist: Type.Array(Type.String({ minLength: 1, maxLength: 64 }), { maxItems: 256, default: [] }),
    /** JWT policy; null is off. */
    jwt: Type.Union([JwtPolicySchema, Type.Null()], { default: null }),
    /** Access-proxy policy; null is off. */
    accessProxy: Type.Union([AccessProxyPolicySchema, Type.Null()], { default: null }),
    /** PostgreSQL wire listener: a slot and server connection per transaction, or held for the whole client session. */
    wirePoolMode: Type.Union([Type.Literal('transaction'), Type.Literal('session')], { default: 'transaction' }),
    /** Wire listeners sharing server connections: a client that creates session state stays on its connection (pinned, holding its slot), or such statements are refused. */
    wireSessionState: Type.Union([Type.Literal('pin'), Type.Literal('refuse')], { default: 'pin' }),
  },
  { additionalProperties: false },
);

export type PoolSettings = Readonly<Static<typeof PoolSettingsSchema>>;

export const DEFAULT_POOL_SETTINGS: PoolSettings = Object.freeze(Value.Default(PoolSettingsSchema, {}) as PoolSettings);

/**
 * The stored jsonb merged over the defaults. Writes are validated whole, so a value that no longer
 * validates only comes from a hand edit or an older schema: that one key falls back to its default.
 */
export function resolvePoolSettings(stored: unknown): PoolSettings {
  const out: Record<string, unknown> = { ...DEFAULT_POOL_SETTINGS };
  if (stored && typeof stored === 'object' && !Array.isArray(stored)) {
    for (const [k, v] of Object.entries(stored)) {
      const schema = (PoolSettingsSchema.properties as Record<string, TSchema>)[k];
      if (schema && Value.Check(schema, v)) out[k] = v;
    }
  }
  return out as PoolSettings;
}

/** A setting (or combination) that is not allowed; the message names the field. Nothing was written. */
export class SettingsError extends Error {
  override name = 'SettingsError';
}

/** The pools columns that are settings too. */
export interface PoolColumns {
  max_concurrent: number;
  require_key: boolean;
  async_enabled: boolean;
  async_on_queue: boolean;
}

function firstSchemaError(value: unknown): string | null {
  const e = Value.Errors(PoolSettingsSchema, value).First();
  if (!e) return null;
  const where = e.path === '' ? 'settings' : `settings${e.path.replaceAll('/', '.')}`;
  return `${where}: ${e.message}`;
}

/** A JWT policy's key source is usable: exactly one of jwksUrl and keys, each key importable. */
function checkJwt(jwt: JwtPolicy, allowHttpJwks: boolean): void {
  if ((jwt.jwksUrl === undefined) === (jwt.keys === undefined)) {
    throw new SettingsError('settings.jwt: set exactly one of jwksUrl and keys');
  }
  if (jwt.jwksUrl !== undefined) {
    let u: URL;
    try {
      u = new URL(jwt.jwksUrl);
    } catch {
      throw new SettingsError('settings.jwt.jwksUrl: not a URL');
    }
    if (u.protocol !== 'https:' && !(allowHttpJwks && u.protocol === 'http:')) {
      throw new SettingsError('settings.jwt.jwksUrl: must be an https URL');
    }
  }
  (jwt.keys ?? []).forEach((k, i) => {
    try {
      importStaticKey(k);
    } catch (err) {
      throw new SettingsError(`settings.jwt.keys.${i}: not a usable public key (JWK or PEM): ${(err as Error).message}`);
    }
  });
}

/**
 * Checks a whole candidate (settings + columns) and returns the settings in force. Throws SettingsError
 * on the first problem: schema, CIDRs, JWT keys, then the cross-field rules.
 */
export function checkSettings(stored: Record<string, unknown>, columns: PoolColumns, opts: { allowHttpJwks?: boolean } = {}): PoolSettings {
  const merged = { ...Value.Default(PoolSettingsSchema, {}) as object, ...stored };
  const schemaError = firstSchemaError(merged);
  if (schemaError) throw new SettingsError(schemaError);
  const settings = merged as PoolSettings;
  const cidrs = (list: readonly string[], where: string) =>
    list.forEach((c, i) => {
      try {
        parseCidr(c);
      } catch (err) {
        throw new SettingsError(`${where}.${i}: ${(err as Error).message}`);
      }
    });
  cidrs(settings.ipAllowlist, 'settings.ipAllowlist');
  if (settings.accessProxy) cidrs(settings.accessProxy.proxies, 'settings.accessProxy.proxies');
  if (settings.jwt) checkJwt(settings.jwt, opts.allowHttpJwks ?? false);
  if (!Number.isInteger(columns.max_concurrent) || columns.max_concurrent < 1 || columns.max_concurrent > 100_000) {
    throw new SettingsError('max_concurrent: must be an integer from 1 to 100000');
  }
  if (settings.renewIntervalMs >= settings.leaseTermMs) {
    throw new SettingsError(`settings.renewIntervalMs (${settings.renewIntervalMs}) must be less than settings.leaseTermMs (${settings.leaseTermMs})`);
  }
  if (settings.adaptiveMin > columns.max_concurrent) {
    throw new SettingsError(`settings.adaptiveMin (${settings.adaptiveMin}) must not exceed max_concurrent (${columns.max_concurrent})`);
  }
  const stray = Object.keys(settings.readPaths).filter((m) => !settings.readMethods.includes(m));
  if (stray.length > 0) {
    throw new SettingsError(`settings.readPaths: ${stray.join(', ')} not in settings.readMethods; list the method in readMethods first`);
  }
  return settings;
}

export const BASE_READ_METHODS = ['GET', 'HEAD', 'OPTIONS'] as const;

/** Methods a key admits (spec: Key access semantics). */
export function allowedMethods(access: 'read' | 'write', settings: PoolSettings): string[] {
  if (access === 'write') return ['GET', 'HEAD', 'OPTIONS', 'POST', 'PUT', 'PATCH', 'DELETE'];
  return [...new Set([...BASE_READ_METHODS, ...settings.readMethods])];
}
