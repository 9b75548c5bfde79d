// GET|PATCH /api/v1/pools/{pool}/settings: the pool settings the spec leaves to the dashboard (an
// extension of the spec). PATCH validates the whole patch and writes it in one transaction, or nothing.
import { Type, type TSchema } from '@sinclair/typebox';
import { actorOf, requireAbility } from './auth.js';
import type { ControlContext, TypedApp } from './context.js';
import { forbidden, notFound, unprocessable } from './errors.js';
import { SUBDOMAIN_PATTERN } from './pool-naming.js';
import { PoolSettingsSchema, SettingsError } from '../store/pool-settings.js';
import { patchPoolSettings, readPoolSettings, type SettingsPatch } from '../store/pool-settings-store.js';
import { checkJwksTarget } from '../policies/jwks-target.js';

const Params = Type.Object({ pool: Type.String({ pattern: SUBDOMAIN_PATTERN }) });

export const MaxConcurrent = Type.Integer({ minimum: 1, maximum: 100_000, description: 'Concurrency cap of the pool (the Pool resource\'s max_concurrent).' });

const SettingsView = Type.Object(
  {
    pool_id: Type.Integer(),
    subdomain: Type.String(),
    max_concurrent: MaxConcurrent,
    require_key: Type.Boolean(),
    async_enabled: Type.Boolean(),
    async_on_queue: Type.Boolean(),
    settings: PoolSettingsSchema,
  },
  { additionalProperties: false },
);

/** Every setting optional; null puts it back to its default. */
const SettingsPatchFields = Type.Object(
  Object.fromEntries(
    Object.entries(PoolSettingsSchema.properties).map(([k, s]) => [k, Type.Optional(Type.Union([s as TSchema, Type.Null()]))]),
  ),
  { additionalProperties: false },
);

const PatchBody = Type.Object(
  {
    max_concurrent: Type.Optional(MaxConcurrent),
    require_key: Type.Optional(Type.Boolean()),
    async_enabled: Type.Optional(Type.Boolean()),
    async_on_queue: Type.Optional(Type.Boolean()),
    settings: Type.Optional(SettingsPatchFields),
  },
  { additionalProperties: false, minProperties: 1 },
);

const EXTENSION = {
  tags: ['extensions'],
  'x-extension': true,
} as const;

const Data = Type.Object({ data: SettingsView }, { additionalProperties: false });

export function settingsRoutes(app: TypedApp, ctx: ControlContext): void {
  app.get(
    '/api/v1/pools/:pool/settings',
    {
      schema: {
        ...EXTENSION,
        summary: 'The pool\'s settings in force, defaults included (extension: not in the service spec)',
        description: 'Extension of the service spec, which leaves pool settings to the dashboard. Needs pools:read.',
        params: Params,
        response: { 200: Data, 403: Type.Ref('Error'), 404: Type.Ref('Error') },
      },
      preValidation: async (req) => {
        requireAbility(req, 'pools:read');
      },
    },
    async (req) => {
      const v = await readPoolSettings(ctx.sql, actorOf(req).teamId, req.params.pool);
      if (!v) throw notFound('pool');
      return { data: v };
    },
  );

  app.patch(
    '/api/v1/pools/:pool/settings',
    {
      schema: {
        ...EXTENSION,
        summary: 'Change pool settings and policies (extension: not in the service spec)',
        description:
          'Extension of the service spec. Needs pools:write and an owner or admin. The whole patch is validated ' +
          '(types, ranges, CIDRs, JWT keys, renewIntervalMs < leaseTermMs, adaptiveMin <= max_concurrent, readPaths ' +
          'methods within readMethods) and written in one transaction, or nothing is written (422). A settings key ' +
          'sent as null goes back to its default. The data plane applies the change within a second.',
        params: Params,
        body: PatchBody,
        response: { 200: Data, 403: Type.Ref('Error'), 404: Type.Ref('Error'), 422: Type.Ref('Error') },
      },
      preValidation: async (req) => {
        const actor = requireAbility(req, 'pools:write');
        if (actor.role !== 'owner' && actor.role !== 'admin') throw forbidden('only owners and admins may change pool settings');
      },
    },
    async (req) => {
      const actor = actorOf(req);
      try {
        await checkJwksTarget(req.body as SettingsPatch, ctx.targets);
        const v = await patchPoolSettings(ctx.sql, actor.teamId, req.params.pool, req.body as SettingsPatch, {
          allowHttpJwks: ctx.config.allowPrivateTargets,
        });
        if (!v) throw notFound('pool');
        return { data: v };
      } catch (err) {
        if (err instanceof SettingsError) throw unprocessable(err.message);
        throw err;
      }
    },
  );
}
