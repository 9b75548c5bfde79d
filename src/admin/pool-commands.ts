// `poolgate admin pool show|set`: the operator's view and edit of one pool's settings and policies
// (the same validation and single-transaction write as PATCH /api/v1/pools/{pool}/settings).
import type { TSchema } from '@sinclair/typebox';
import { findPool } from '../store/pools.js';
import { MaxConcurrent } from '../control/settings.js';
import { poolLimitView } from '../control/live.js';
import { AdminUsageError, intOption, need, teamOf, type Command } from './command.js';
import { PoolSettingsSchema, SettingsError } from '../store/pool-settings.js';
import { patchPoolSettings, readPoolSettings, type SettingsPatch } from '../store/pool-settings-store.js';
import { checkJwksTarget } from '../policies/jwks-target.js';
import { ownHosts, systemLookup } from '../security/targets.js';

const kebab = (k: string) => k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);

/** How a flag's text becomes a setting's value, from the setting's schema. */
type Kind = 'integer' | 'boolean' | 'list' | 'json';

interface FlagKind { kind: Kind; nullable: boolean; min?: number; max?: number }

function kindOf(schema: TSchema): FlagKind {
  const anyOf = schema.anyOf as TSchema[] | undefined;
  if (anyOf) {
    const inner = anyOf.find((s) => s.type !== 'null')!;
    return inner.type === 'integer' ? { kind: 'integer', nullable: true, min: inner.minimum, max: inner.maximum } : { kind: 'json', nullable: true };
  }
  // The schema's own range, so the CLI says the range the API enforces (issue 26 item 5).
  if (schema.type === 'integer') return { kind: 'integer', nullable: false, min: schema.minimum, max: schema.maximum };
  if (schema.type === 'boolean') return { kind: 'boolean', nullable: false };
  if (schema.type === 'array' && (schema.items as TSchema).type === 'string') return { kind: 'list', nullable: false };
  return { kind: 'json', nullable: false };
}

const SETTING_FLAGS = Object.entries(PoolSettingsSchema.properties).map(([key, schema]) => ({ key, flag: kebab(key), ...kindOf(schema as TSchema) }));

const COLUMN_FLAGS = [
  { column: 'max_concurrent', flag: 'max-concurrent', kind: 'integer', min: MaxConcurrent.minimum, max: MaxConcurrent.maximum },
  { column: 'require_key', flag: 'require-key', kind: 'boolean' },
  { column: 'async_enabled', flag: 'async-enabled', kind: 'boolean' },
  { column: 'async_on_queue', flag: 'async-on-queue', kind: 'boolean' },
] as const;

function parseValue(text: string, f: FlagKind & { flag: string }): unknown {
  const { kind, nullable, flag } = f;
  const t = text.trim();
  if (nullable && (t === 'none' || t === 'null' || t === '')) return null;
  switch (kind) {
    case 'integer':
      return intOption(t, flag, f.min ?? 0, f.max);
    case 'boolean':
      if (['true', 'on', 'yes', '1'].includes(t.toLowerCase())) return true;
      if (['false', 'off', 'no', '0'].includes(t.toLowerCase())) return false;
      throw new AdminUsageError(`--${flag} must be true or false`);
    case 'list':
      return t === '' || t === 'none' ? [] : t.split(',').map((x) => x.trim()).filter(Boolean);
    case 'json':
      try {
        return JSON.parse(t);
      } catch {
        throw new AdminUsageError(`--${flag} must be JSON${nullable ? ' or none' : ''}`);
      }
  }
}

const flagHelp = [
  ...COLUMN_FLAGS.map((c) => `--${c.flag} ${c.kind === 'integer' ? 'N' : 'true|false'}`),
  ...SETTING_FLAGS.map((s) => `--${s.flag} ${s.kind === 'integer' ? (s.nullable ? 'N|none' : 'N') : s.kind === 'boolean' ? 'true|false' : s.kind === 'list' ? 'A,B,…' : s.nullable ? 'JSON|none' : 'JSON'}`),
  '--reset NAME,NAME (settings back to their defaults)',
].join(' ');

export const poolCommands: Record<string, Command> = {
  'pool show': {
    usage: 'admin pool show <subdomain> --team TEAM   (max_concurrent, require_key, async columns, every setting in force, and the effective limit with the adaptive limit\'s last adjustments)',
    options: { team: { type: 'string' }, pool: { type: 'string' } },
    positional: 'pool',
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const subdomain = need(v, 'pool');
      const view = await readPoolSettings(deps.sql, team.id, subdomain);
      const pool = await findPool(deps.sql, team.id, subdomain);
      if (!view || !pool) throw new AdminUsageError(`pool ${JSON.stringify(subdomain)} not found in team ${team.slug}`);
      // Why the effective limit is what it is: only a running data plane knows (reporting false otherwise).
      return { ...view, limit: poolLimitView(pool, deps.live?.source ?? null) };
    },
  },

  'pool set': {
    usage: `admin pool set <subdomain> --team TEAM ${flagHelp}`,
    options: {
      team: { type: 'string' },
      pool: { type: 'string' },
      reset: { type: 'string' },
      ...Object.fromEntries([...COLUMN_FLAGS, ...SETTING_FLAGS].map((f) => [f.flag, { type: 'string' as const }])),
    },
    positional: 'pool',
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const subdomain = need(v, 'pool');
      const patch: SettingsPatch & { settings: Record<string, unknown> } = { settings: {} };
      const cols = patch as unknown as Record<string, unknown>;
      for (const c of COLUMN_FLAGS) {
        const raw = v[c.flag];
        if (typeof raw === 'string') cols[c.column] = parseValue(raw, { nullable: false, ...c });
      }
      for (const s of SETTING_FLAGS) {
        const raw = v[s.flag];
        if (typeof raw === 'string') patch.settings[s.key] = parseValue(raw, s);
      }
      if (typeof v.reset === 'string') {
        for (const name of v.reset.split(',').map((x) => x.trim()).filter(Boolean)) {
          const s = SETTING_FLAGS.find((f) => f.key === name || f.flag === name);
          if (!s) throw new AdminUsageError(`--reset: unknown setting ${JSON.stringify(name)}`);
          patch.settings[s.key] = null;
        }
      }
      if (Object.keys(patch).length === 1 && Object.keys(patch.settings).length === 0) {
        throw new AdminUsageError('nothing to change: pass at least one setting flag');
      }
      try {
        const c = deps.config;
        await checkJwksTarget(patch, {
          allowPrivate: c.allowPrivateTargets,
          ownHosts: ownHosts(c, [c.baseUrl ?? '', c.lockApiUrl ?? '']),
          lookup: systemLookup,
        });
        const view = await patchPoolSettings(deps.sql, team.id, subdomain, patch, { allowHttpJwks: deps.config.allowPrivateTargets });
        if (!view) throw new AdminUsageError(`pool ${JSON.stringify(subdomain)} not found in team ${team.slug}`);
        return view;
      } catch (err) {
        if (err instanceof SettingsError) throw new AdminUsageError(err.message);
        throw err;
      }
    },
  },
};
