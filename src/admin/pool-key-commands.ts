// `poolgate admin pool list|create|delete` and `key list|create|revoke`: what an operator reaches for first, on the
// store directly (the same rules as the Control API routes; key list reads the store, never a plaintext key).
import { AdminUsageError, intOption, need, oneOf, teamOf, type AdminDeps, type Command } from './command.js';
import { ApiError } from '../control/errors.js';
import { createOriginPool } from '../control/pools.js';
import { DEFAULT_KEY_LABEL, EXPIRY_PRESETS, poolKeyView } from '../control/keys.js';
import { deletePool, findPool, findPoolById, listPools, poolView, type PoolRow } from '../store/pools.js';
import { insertKey, revokeKey, type KeyAccess, type PoolKeyRow } from '../store/keys.js';
import { resolvePoolSettings } from '../store/pool-settings.js';
import { CHANGE_CHANNEL } from '../store/sql.js';
import { lastFour, newKeySigningSecret, newPoolKey, sha256Hex } from '../security/tokens.js';
import { ownHosts, systemLookup } from '../security/targets.js';

async function poolOf(deps: AdminDeps, teamRef: string, subdomain: string): Promise<{ teamSlug: string; pool: PoolRow }> {
  const team = await teamOf(deps, teamRef);
  const pool = await findPool(deps.sql, team.id, subdomain);
  if (!pool) throw new AdminUsageError(`pool ${JSON.stringify(subdomain)} not found in team ${team.slug}`);
  return { teamSlug: team.slug, pool };
}

/** A Control API refusal (422 for a refused origin) is the operator's input: exit 2 with its message. */
async function asUsage<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof ApiError && err.statusCode < 500) throw new AdminUsageError(err.message);
    throw err;
  }
}

export const poolKeyCommands: Record<string, Command> = {
  'pool list': {
    usage: 'admin pool list --team TEAM',
    options: { team: { type: 'string' } },
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const pools = await listPools(deps.sql, team.id);
      return { data: pools.map((p) => ({ ...poolView(p), origin: p.origin, db_host: p.db_host, db_port: p.db_port, db_name: p.db_name, status: p.status })) };
    },
  },

  'pool create': {
    usage: 'admin pool create --team TEAM --origin https://HOST[:PORT] [--name NAME]   (database pools: POST /api/v1/pools/database)',
    options: { team: { type: 'string' }, origin: { type: 'string' }, name: { type: 'string' } },
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const c = deps.config;
      const targets = { allowPrivate: c.allowPrivateTargets, ownHosts: ownHosts(c, [c.baseUrl ?? '', c.lockApiUrl ?? '']), lookup: systemLookup };
      const out = await asUsage(() => createOriginPool({ sql: deps.sql, targets }, team.id, { origin: need(v, 'origin'), name: (v.name as string | undefined) ?? null }));
      const row = await findPoolById(deps.sql, team.id, out.id);
      return { created: out.created, data: poolView(row!) };
    },
  },

  'pool delete': {
    usage: 'admin pool delete <subdomain> --team TEAM   (revokes its keys; docs/pools.md)',
    options: { team: { type: 'string' }, pool: { type: 'string' } },
    positional: 'pool',
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const subdomain = need(v, 'pool');
      const out = await deps.sql.transaction((tx) => deletePool(tx, team.id, subdomain, deps.now()));
      if (!out) throw new AdminUsageError(`pool ${JSON.stringify(subdomain)} not found in team ${team.slug}`);
      await deps.sql.notify(CHANGE_CHANNEL, `pool:${out.pool.id}`);
      return { deleted: poolView(out.pool), keys_revoked: out.keysRevoked };
    },
  },

  'key list': {
    usage: 'admin key list <subdomain> --team TEAM   (ids, labels, last four characters; never the keys)',
    options: { team: { type: 'string' }, pool: { type: 'string' } },
    positional: 'pool',
    async run(v, deps) {
      const { pool } = await poolOf(deps, need(v, 'team'), need(v, 'pool'));
      const { rows } = await deps.sql.query<PoolKeyRow>(
        `SELECT id, pool_id, label, key_hash, last_four, access, signing_secret_enc, expires_at, revoked_at, created_at
           FROM pool_keys WHERE pool_id = $1 ORDER BY id`,
        [pool.id],
      );
      const settings = resolvePoolSettings(pool.settings);
      return { data: rows.map((r) => poolKeyView(r, settings)) };
    },
  },

  'key create': {
    usage: `admin key create <subdomain> --team TEAM [--label L] [--access read|write] [--expires ${Object.keys(EXPIRY_PRESETS).join('|')}]   (the key is shown once)`,
    options: { team: { type: 'string' }, pool: { type: 'string' }, label: { type: 'string' }, access: { type: 'string' }, expires: { type: 'string' } },
    positional: 'pool',
    async run(v, deps) {
      const { pool } = await poolOf(deps, need(v, 'team'), need(v, 'pool'));
      const access = oneOf((v.access as string | undefined) ?? 'write', ['read', 'write'] as const, 'access') as KeyAccess;
      const preset = oneOf((v.expires as string | undefined) ?? 'none', Object.keys(EXPIRY_PRESETS) as (keyof typeof EXPIRY_PRESETS)[], 'expires');
      const label = ((v.label as string | undefined) ?? DEFAULT_KEY_LABEL).trim();
      if (label.length < 1 || label.length > 60 || /[\u0000-\u001f\u007f]/.test(label)) throw new AdminUsageError('--label must be 1 to 60 characters without control characters');
      const now = deps.now();
      const ttl = EXPIRY_PRESETS[preset];
      const settings = resolvePoolSettings(pool.settings);
      const key = newPoolKey();
      const signingSecret = settings.originSigning ? newKeySigningSecret() : null;
      const row = await insertKey(deps.sql, {
        poolId: pool.id, label, keyHash: sha256Hex(key), lastFour: lastFour(key), access,
        signingSecretEnc: signingSecret === null ? null : deps.box.seal(signingSecret),
        expiresAt: ttl === null ? null : new Date(now.getTime() + ttl), now,
      });
      await deps.sql.notify(CHANGE_CHANNEL, `key:${row.id}`);
      return { data: poolKeyView(row, settings, { key, signingSecret }) };
    },
  },

  'key revoke': {
    usage: 'admin key revoke <subdomain> --team TEAM --id KEY_ID',
    options: { team: { type: 'string' }, pool: { type: 'string' }, id: { type: 'string' } },
    positional: 'pool',
    async run(v, deps) {
      const { pool, teamSlug } = await poolOf(deps, need(v, 'team'), need(v, 'pool'));
      const id = intOption(need(v, 'id'), 'id', 1);
      const revoked = await revokeKey(deps.sql, pool.id, id, deps.now());
      if (!revoked) throw new AdminUsageError(`key ${id} not found in pool ${pool.subdomain} of team ${teamSlug}`);
      if (revoked.changed) await deps.sql.notify(CHANGE_CHANNEL, `key:${revoked.key.id}`);
      return { data: poolKeyView(revoked.key, resolvePoolSettings(pool.settings)) };
    },
  },
};
