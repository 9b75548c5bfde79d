// Pools: list, show, create an https pass-through pool, create a database pool (reusing a live pool
// of the team that already fronts the same upstream).
import { Type } from '@sinclair/typebox';
import { requireAbility } from './auth.js';
import type { ControlContext, TypedApp } from './context.js';
import { isUniqueViolation, notFound, unprocessable } from './errors.js';
import { DataListOf, DataOf } from './schemas.js';
import { cleanName, NAME_MAX, parseDbHost, parseOrigin, subdomainCandidates, SUBDOMAIN_PATTERN } from './pool-naming.js';
import { checkTarget } from '../security/targets.js';
import { deletePool, findPool, findPoolById, listPools, poolView } from '../store/pools.js';
import { forbidden } from './errors.js';
import { CHANGE_CHANNEL, type Queryable } from '../store/sql.js';

export const PoolParams = Type.Object({ pool: Type.String({ pattern: SUBDOMAIN_PATTERN }) });

const NameField = Type.Optional(Type.Union([Type.String({ minLength: 1, maxLength: NAME_MAX }), Type.Null()]));

const CreatePoolBody = Type.Object(
  { origin: Type.String({ minLength: 1, maxLength: 2048 }), name: NameField },
  { additionalProperties: false },
);

const CreateDatabasePoolBody = Type.Object(
  {
    db_host: Type.String({ minLength: 1, maxLength: 255 }),
    db_name: Type.String({ minLength: 1, maxLength: 64 }),
    db_port: Type.Optional(Type.Union([Type.Integer({ minimum: 1, maximum: 65535 }), Type.Null()])),
    db_sslmode: Type.Optional(Type.Union([Type.Literal('verify-full'), Type.Literal('require'), Type.Null()])),
    // Extension of the spec (issue 20): the engine, explicit. Absent: mysql when db_port is 3306, postgres otherwise.
    backend: Type.Optional(Type.Union([Type.Literal('postgres'), Type.Literal('mysql'), Type.Null()], {
      description: 'postgres or mysql. Absent or null: mysql when db_port is 3306, postgres otherwise (and db_port defaults to the engine\'s usual port).',
    })),
    name: NameField,
  },
  { additionalProperties: false },
);

const MYSQL_PORT = 3306;
const POSTGRES_PORT = 5432;

/** What a new pool row fronts; everything else takes the table's defaults (spec: default settings). */
type Upstream =
  | { backend: 'http'; origin: string; origin_host: string }
  | { backend: 'postgres' | 'mysql'; db_host: string; db_port: number; db_name: string; db_sslmode: string };

class NameTaken extends Error {}

/**
 * The pool to reuse or the id of a new one, in one transaction. An advisory lock on the upstream key
 * serialises concurrent creates for the same upstream, so two racing calls yield one pool (201 then 200).
 */
interface CreateRequest {
  teamId: number;
  /** Names the upstream; creates for the same key are serialised. */
  lockKey: string;
  findExisting: (tx: Queryable) => Promise<number | null>;
  name: { explicit: string } | { derived: string };
  upstream: Upstream;
}

async function createOrReuse(tx: Queryable, { teamId, lockKey, findExisting, name, upstream }: CreateRequest): Promise<{ id: number; created: boolean }> {
  await tx.query('SELECT pg_advisory_xact_lock(hashtext($1))', [lockKey]);
  const existing = await findExisting(tx);
  if (existing !== null) return { id: existing, created: false };

  const taken = async (n: string) =>
    (await tx.query('SELECT 1 FROM pools WHERE team_id = $1 AND name = $2', [teamId, n])).rows.length > 0;
  let poolName: string;
  if ('explicit' in name) {
    if (await taken(name.explicit)) throw new NameTaken(name.explicit);
    poolName = name.explicit;
  } else {
    // A derived name never fails the call: the next free "<host> (n)" is used instead.
    poolName = name.derived;
    for (let n = 2; await taken(poolName); n++) poolName = `${name.derived} (${n})`;
  }

  const u = upstream;
  for (const subdomain of subdomainCandidates(poolName)) {
    const { rows } = await tx.query<{ id: number }>(
      `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, db_host, db_port, db_name, db_sslmode)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
       ON CONFLICT (subdomain) DO NOTHING RETURNING id`,
      [
        teamId, poolName, subdomain, u.backend,
        u.backend === 'http' ? u.origin : null, u.backend === 'http' ? u.origin_host : null,
        u.backend === 'http' ? null : u.db_host, u.backend === 'http' ? null : u.db_port,
        u.backend === 'http' ? null : u.db_name, u.backend === 'http' ? null : u.db_sslmode,
      ],
    );
    if (rows[0]) return { id: rows[0].id, created: true };
  }
  throw new Error('no free subdomain after several random suffixes');
}

/** Runs createOrReuse, turning a racing unique violation into the right answer instead of a 500. */
async function createPool(ctx: Pick<ControlContext, 'sql'>, request: CreateRequest): Promise<{ id: number; created: boolean }> {
  const { name } = request;
  for (let attempt = 0; ; attempt++) {
    try {
      const out = await ctx.sql.transaction((tx) => createOrReuse(tx, request));
      if (out.created) await ctx.sql.notify(CHANGE_CHANNEL, `pool:${out.id}`);
      return out;
    } catch (err) {
      if (err instanceof NameTaken) throw unprocessable(`a pool named ${JSON.stringify(err.message)} already exists in this team`);
      if (!isUniqueViolation(err)) throw err;
      // A concurrent create took the name between our check and insert.
      if ('explicit' in name) throw unprocessable(`a pool named ${JSON.stringify(name.explicit)} already exists in this team`);
      if (attempt >= 3) throw err;
    }
  }
}

function nameOf(raw: string | null | undefined, derived: string): { explicit: string } | { derived: string } {
  if (raw === undefined || raw === null) return { derived };
  const n = cleanName(raw);
  if (!n.ok) throw unprocessable(n.reason);
  return { explicit: n.value };
}

async function poolResponse(ctx: ControlContext, teamId: number, id: number) {
  const row = await findPoolById(ctx.sql, teamId, id);
  if (!row) throw notFound('pool');
  return { data: poolView(row) };
}

/** POST /api/v1/pools's work, shared with `poolgate admin pool create`: a 422 ApiError for a refused origin. */
export async function createOriginPool(
  ctx: Pick<ControlContext, 'sql' | 'targets'>,
  teamId: number,
  body: { origin: string; name?: string | null },
): Promise<{ id: number; created: boolean }> {
  const parsed = parseOrigin(body.origin);
  if (!parsed.ok) throw unprocessable(`invalid origin: ${parsed.reason}`);
  const origin = parsed.value;
  const name = nameOf(body.name, origin.host);
  const verdict = await checkTarget(origin.hostname, ctx.targets);
  if (!verdict.ok) throw unprocessable(`origin host refused: ${verdict.reason}`);
  return createPool(ctx, {
    teamId,
    lockKey: `pool-origin:${teamId}:${origin.host}`,
    findExisting: async (tx) => {
      const { rows } = await tx.query<{ id: number }>(
        `SELECT id FROM pools WHERE team_id = $1 AND backend = 'http' AND origin_host = $2 AND status <> 'deleted' ORDER BY id LIMIT 1`,
        [teamId, origin.host],
      );
      return rows[0]?.id ?? null;
    },
    name,
    upstream: { backend: 'http', origin: origin.origin, origin_host: origin.host },
  });
}

export function poolRoutes(app: TypedApp, ctx: ControlContext): void {
  app.get(
    '/api/v1/pools',
    { schema: { tags: ['pools'], summary: 'Pools granted to the token', response: { 200: DataListOf('Pool') } } },
    async (req) => {
      const actor = requireAbility(req, 'pools:read');
      return { data: (await listPools(ctx.sql, actor.teamId)).map(poolView) };
    },
  );

  app.get(
    '/api/v1/pools/:pool',
    { schema: { tags: ['pools'], summary: 'One pool by subdomain', params: PoolParams, response: { 200: DataOf('Pool'), 404: Type.Ref('Error') } } },
    async (req) => {
      const actor = requireAbility(req, 'pools:read');
      const row = await findPool(ctx.sql, actor.teamId, req.params.pool);
      if (!row) throw notFound('pool');
      return { data: poolView(row) };
    },
  );

  app.delete(
    '/api/v1/pools/:pool',
    {
      schema: {
        tags: ['pools'],
        summary: 'Delete a pool (extension of the service spec)',
        description:
          'Needs pools:write and an owner or admin. The pool stops taking traffic on every node within a change-feed delivery: ' +
          'requests already holding a slot finish, requests waiting for one are refused, wire sessions end. Its keys are revoked, ' +
          'its budget attachment is dropped, its queued async jobs are not run (they expire at their TTL), and its subdomain is ' +
          'never reused. Answers the deleted pool.',
        params: PoolParams,
        response: { 200: DataOf('Pool'), 403: Type.Ref('Error'), 404: Type.Ref('Error') },
      },
    },
    async (req) => {
      const actor = requireAbility(req, 'pools:write');
      if (actor.role !== 'owner' && actor.role !== 'admin') throw forbidden('only owners and admins may delete pools');
      const out = await ctx.sql.transaction((tx) => deletePool(tx, actor.teamId, req.params.pool, ctx.now()));
      if (!out) throw notFound('pool');
      // A full reload on every node: the pool, its keys and its limits leave the snapshot together.
      await ctx.sql.notify(CHANGE_CHANNEL, `pool:${out.pool.id}`);
      ctx.log.info({ event: 'pool_deleted', pool: out.pool.subdomain, team: actor.teamId, tokenId: actor.tokenId, keysRevoked: out.keysRevoked.length }, 'pool deleted');
      return { data: poolView(out.pool) };
    },
  );

  app.post(
    '/api/v1/pools',
    {
      schema: {
        tags: ['pools'],
        summary: 'Create an https pass-through pool, or reuse the live pool already fronting that host',
        body: CreatePoolBody,
        response: { 200: DataOf('Pool'), 201: DataOf('Pool'), 403: Type.Ref('Error'), 422: Type.Ref('Error') },
      },
    },
    async (req, reply) => {
      const actor = requireAbility(req, 'pools:write');
      const out = await createOriginPool(ctx, actor.teamId, req.body);
      reply.code(out.created ? 201 : 200);
      return poolResponse(ctx, actor.teamId, out.id);
    },
  );

  app.post(
    '/api/v1/pools/database',
    {
      schema: {
        tags: ['pools'],
        summary: 'Create a database pool (backend postgres or mysql; absent: port 3306 → mysql, otherwise postgres), or reuse the live one of that engine for that database',
        body: CreateDatabasePoolBody,
        response: { 200: DataOf('Pool'), 201: DataOf('Pool'), 403: Type.Ref('Error'), 422: Type.Ref('Error') },
      },
    },
    async (req, reply) => {
      const actor = requireAbility(req, 'pools:write');
      const host = parseDbHost(req.body.db_host);
      if (!host.ok) throw unprocessable(host.reason);
      const dbName = req.body.db_name;
      if (/[\u0000-\u001f\u007f]/.test(dbName) || dbName.trim() !== dbName) {
        throw unprocessable('db_name must not contain control characters or surrounding spaces');
      }
      const explicit = req.body.backend ?? null;
      const port = req.body.db_port ?? (explicit === 'mysql' ? MYSQL_PORT : POSTGRES_PORT);
      const backend = explicit ?? (port === MYSQL_PORT ? 'mysql' : 'postgres');
      const defaultPort = backend === 'mysql' ? MYSQL_PORT : POSTGRES_PORT;
      const verdict = await checkTarget(host.value, ctx.targets);
      if (!verdict.ok) throw unprocessable(`db_host refused: ${verdict.reason}`);
      const hostPort = port === defaultPort ? host.value : `${host.value}:${port}`;
      const name = nameOf(req.body.name, `${hostPort}/${dbName}`);

      const out = await createPool(ctx, {
        teamId: actor.teamId,
        lockKey: `pool-db:${actor.teamId}:${backend}:${host.value}:${port}:${dbName}`,
        findExisting: async (tx) => {
          const { rows } = await tx.query<{ id: number }>(
            `SELECT id FROM pools
              WHERE team_id = $1 AND backend = $5 AND db_host = $2 AND db_port = $3 AND db_name = $4
                AND status <> 'deleted' ORDER BY id LIMIT 1`,
            [actor.teamId, host.value, port, dbName, backend],
          );
          return rows[0]?.id ?? null;
        },
        name,
        // TLS is verified unless the caller asks for encryption only: the safe default for a public host.
        upstream: { backend, db_host: host.value, db_port: port, db_name: dbName, db_sslmode: req.body.db_sslmode ?? 'verify-full' },
      });
      reply.code(out.created ? 201 : 200);
      return poolResponse(ctx, actor.teamId, out.id);
    },
  );
}
