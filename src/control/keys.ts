// Pool keys: mint (plaintext shown once, stored as a hash) and revoke (spec: Pool keys, Key access semantics).
import { Type, type Static } from '@sinclair/typebox';
import type { PoolKeyT } from './schemas.js';
import { DataListOf, DataOf } from './schemas.js';
import { actorOf, requireAbility } from './auth.js';
import type { ControlContext, TypedApp } from './context.js';
import { notFound, unprocessable } from './errors.js';
import { findPool } from '../store/pools.js';
import { insertKey, listPoolKeys, revokeKey, type KeyAccess, type PoolKeyRow } from '../store/keys.js';
import { allowedMethods, BASE_READ_METHODS, resolvePoolSettings, type PoolSettings } from '../store/pool-settings.js';
import { CHANGE_CHANNEL } from '../store/sql.js';
import { lastFour, newKeySigningSecret, newPoolKey, sha256Hex } from '../security/tokens.js';

export const DEFAULT_KEY_LABEL = 'key';

/** Key lifetime presets (spec: Limits); `none` is no expiry. */
export const EXPIRY_PRESETS = { none: null, '1h': 3_600_000, '24h': 86_400_000, '7d': 7 * 86_400_000 } as const;
export type ExpiryPreset = keyof typeof EXPIRY_PRESETS;

/** An explicit expires_at may lie at most this far ahead; longer-lived keys are minted without expiry. */
export const MAX_EXPIRES_AHEAD_MS = 365 * 86_400_000;

const PoolParams = Type.Object({ pool: Type.String({ minLength: 1, maxLength: 63 }) });
const KeyParams = Type.Object({
  pool: Type.String({ minLength: 1, maxLength: 63 }),
  apiKey: Type.Integer({ minimum: 1, maximum: 2147483647 }),
});

const MintKeyBody = Type.Object(
  {
    // No control characters: labels are shown in lists and logs.
    label: Type.Optional(Type.String({ minLength: 1, maxLength: 60, pattern: '^[^\\u0000-\\u001F\\u007F]*$' })),
    expires_preset: Type.Optional(Type.Union(Object.keys(EXPIRY_PRESETS).map((p) => Type.Literal(p)))),
    expires_at: Type.Optional(Type.Union([Type.String({ format: 'date-time' }), Type.Null()])),
    access: Type.Optional(Type.Union([Type.Literal('read'), Type.Literal('write')])),
  },
  { additionalProperties: false },
);
type MintKeyBodyT = Static<typeof MintKeyBody>;

/** The expiry a mint request asks for: null for none; a 422 for both forms, a past time or one too far ahead. */
export function resolveExpiry(body: Pick<MintKeyBodyT, 'expires_preset' | 'expires_at'>, now: Date): Date | null {
  const at = body.expires_at ?? null;
  if (body.expires_preset !== undefined && at !== null) {
    throw unprocessable('send either expires_preset or expires_at, not both');
  }
  if (at !== null) {
    const ms = Date.parse(at);
    // The date-time format admits a leap second (…:60) that Date cannot represent.
    if (Number.isNaN(ms)) throw unprocessable('body.expires_at is not a valid date-time');
    if (ms <= now.getTime()) throw unprocessable('body.expires_at must be in the future');
    if (ms > now.getTime() + MAX_EXPIRES_AHEAD_MS) {
      throw unprocessable('body.expires_at must be at most 365 days ahead; mint a key without expiry for longer');
    }
    return new Date(ms);
  }
  const ttl = EXPIRY_PRESETS[(body.expires_preset ?? 'none') as ExpiryPreset];
  return ttl === null ? null : new Date(now.getTime() + ttl);
}

/**
 * read_paths of a read key: the pool's path-prefix restrictions for the extra read methods it admits.
 * Absent for write keys (they admit every method everywhere) and when the pool restricts nothing.
 */
function readPathsOf(access: KeyAccess, settings: PoolSettings): Record<string, string[]> | undefined {
  if (access !== 'read') return undefined;
  const extra = new Set(allowedMethods('read', settings).filter((m) => !(BASE_READ_METHODS as readonly string[]).includes(m)));
  const entries = Object.entries(settings.readPaths).filter(([m, paths]) => extra.has(m) && paths.length > 0);
  return entries.length > 0 ? Object.fromEntries(entries) : undefined;
}

const iso = (d: Date | null): string | null => (d === null ? null : d.toISOString());

/** The PoolKey view; methods and read paths follow the pool's current settings. */
export function poolKeyView(row: PoolKeyRow, settings: PoolSettings, once?: { key: string; signingSecret: string | null }): PoolKeyT {
  const view: PoolKeyT = {
    id: row.id,
    label: row.label,
    last_four: row.last_four,
    access: row.access,
    allowed_methods: allowedMethods(row.access, settings),
    expires_at: iso(row.expires_at),
    revoked_at: iso(row.revoked_at),
    created_at: iso(row.created_at),
  };
  const readPaths = readPathsOf(row.access, settings);
  if (readPaths) view.read_paths = readPaths;
  if (once) {
    view.key = once.key;
    if (once.signingSecret !== null) view.signing_secret = once.signingSecret;
  }
  return view;
}

export function keyRoutes(app: TypedApp, ctx: ControlContext): void {
  app.get(
    '/api/v1/pools/:pool/keys',
    {
      schema: {
        tags: ['pool keys'],
        summary: 'List a pool\'s keys, revoked and expired ones included, newest first (never the plaintext key)',
        description: 'Extension of the service spec (the dashboard lists keys). Needs pools:read, the ability that shows the pool.',
        params: PoolParams,
        response: { 200: DataListOf('PoolKey'), 403: Type.Ref('Error'), 404: Type.Ref('Error') },
      },
      preValidation: async (req) => {
        requireAbility(req, 'pools:read');
      },
    },
    async (req) => {
      const actor = actorOf(req);
      const pool = await findPool(ctx.sql, actor.teamId, req.params.pool);
      if (!pool) throw notFound('pool');
      const settings = resolvePoolSettings(pool.settings);
      return { data: (await listPoolKeys(ctx.sql, pool.id)).map((row) => poolKeyView(row, settings)) };
    },
  );

  app.post(
    '/api/v1/pools/:pool/keys',
    {
      schema: {
        tags: ['pool keys'],
        summary: 'Mint a pool key; the plaintext key (and signing secret) is returned once',
        params: PoolParams,
        body: MintKeyBody,
        response: { 201: DataOf('PoolKey'), 403: Type.Ref('Error'), 404: Type.Ref('Error'), 422: Type.Ref('Error') },
      },
      config: { bodyOptional: true },
      // Ability first, so a token without keys:write learns nothing from validation errors. The body is
      // optional: no body (or an empty one) mints with every default.
      preValidation: async (req) => {
        requireAbility(req, 'keys:write');
        if (req.body === undefined) req.body = {};
      },
    },
    async (req, reply) => {
      const actor = actorOf(req);
      const body: MintKeyBodyT = req.body;
      const pool = await findPool(ctx.sql, actor.teamId, req.params.pool);
      if (!pool) throw notFound('pool');
      const now = ctx.now();
      const expiresAt = resolveExpiry(body, now);
      const settings = resolvePoolSettings(pool.settings);
      const access: KeyAccess = body.access ?? 'write';
      const key = newPoolKey();
      const signingSecret = settings.originSigning ? newKeySigningSecret() : null;
      const row = await insertKey(ctx.sql, {
        poolId: pool.id,
        label: body.label ?? DEFAULT_KEY_LABEL,
        keyHash: sha256Hex(key),
        lastFour: lastFour(key),
        access,
        signingSecretEnc: signingSecret === null ? null : ctx.box.seal(signingSecret),
        expiresAt,
        now,
      });
      await ctx.sql.notify(CHANGE_CHANNEL, `key:${row.id}`);
      return reply.code(201).send({ data: poolKeyView(row, settings, { key, signingSecret }) });
    },
  );

  app.delete(
    '/api/v1/pools/:pool/keys/:apiKey',
    {
      schema: {
        tags: ['pool keys'],
        summary: 'Revoke a pool key (idempotent: a revoked key keeps its first revoked_at)',
        params: KeyParams,
        response: { 200: DataOf('PoolKey'), 403: Type.Ref('Error'), 404: Type.Ref('Error') },
      },
      preValidation: async (req) => {
        requireAbility(req, 'keys:write');
      },
    },
    async (req) => {
      const actor = actorOf(req);
      const pool = await findPool(ctx.sql, actor.teamId, req.params.pool);
      if (!pool) throw notFound('pool');
      const revoked = await revokeKey(ctx.sql, pool.id, req.params.apiKey, ctx.now());
      if (!revoked) throw notFound('key');
      if (revoked.changed) await ctx.sql.notify(CHANGE_CHANNEL, `key:${revoked.key.id}`);
      return { data: poolKeyView(revoked.key, resolvePoolSettings(pool.settings)) };
    },
  );
}
