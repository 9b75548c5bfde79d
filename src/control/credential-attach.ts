// Managed origin credentials of a pool: the auth handoff (flip to managed auth, mint a one-shot intake)
// and PUT …/credential (attach a stored record or an inline secret).
import { Type } from '@sinclair/typebox';
import { requireAbility } from './auth.js';
import type { ControlContext, TypedApp } from './context.js';
import { isUniqueViolation, notFound, unprocessable } from './errors.js';
import { AUTH_METHODS, DataOf, type AuthHandoffT, type AuthMethod } from './schemas.js';
import { PoolParams } from './pools.js';
import { cleanName, NAME_MAX } from './pool-naming.js';
import {
  backendMismatch,
  freeCredentialName,
  givenSecretFields,
  methodFitsBackend,
  requiredFields,
  secretFor,
  SecretFieldProps,
} from './credential-fields.js';
import { newIntakeToken, sha256Hex } from '../security/tokens.js';
import { createCredential, findCredential, type CredentialRow } from '../store/credentials.js';
import { findPool, findPoolById, poolView, type PoolRow } from '../store/pools.js';
import { CHANGE_CHANNEL, type Queryable } from '../store/sql.js';

const Method = Type.Union(AUTH_METHODS.map((m) => Type.Literal(m)));

const AuthHandoffBody = Type.Object(
  {
    auth_method: Method,
    credential_id: Type.Optional(Type.Union([Type.Integer({ minimum: 1, maximum: 2147483647 }), Type.Null()])),
    credential_name: Type.Optional(Type.Union([Type.String({ minLength: 1, maxLength: NAME_MAX }), Type.Null()])),
  },
  { additionalProperties: false },
);

const AttachCredentialBody = Type.Object(
  {
    credential_id: Type.Optional(Type.Integer({ minimum: 1, maximum: 2147483647 })),
    method: Type.Optional(Method),
    name: Type.Optional(Type.String({ minLength: 1, maxLength: NAME_MAX })),
    ...SecretFieldProps,
  },
  { additionalProperties: false },
);

/** The pool row locked for this transaction, so concurrent handoffs and attaches apply one after another. */
async function lockPool(tx: Queryable, teamId: number, subdomain: string): Promise<PoolRow> {
  const pool = await findPool(tx, teamId, subdomain);
  if (!pool) throw notFound('pool');
  await tx.query('SELECT 1 FROM pools WHERE id = $1 FOR UPDATE', [pool.id]);
  return (await findPoolById(tx, teamId, pool.id))!;
}

/** Credential referenced from a request body: unknown ids (and other teams' ids) are a validation failure. */
async function referencedCredential(tx: Queryable, teamId: number, id: number): Promise<CredentialRow> {
  const cred = await findCredential(tx, teamId, { id });
  if (!cred) throw unprocessable(`credential ${id} not found`);
  return cred;
}

function checkMethodMatch(cred: CredentialRow, method: AuthMethod): void {
  if (cred.method !== method) throw unprocessable(`method mismatch: credential ${JSON.stringify(cred.name)} is ${cred.method}, not ${method}`);
}

function nextStep(attached: CredentialRow | null, method: AuthMethod): string {
  if (attached) return `Nothing more to do: the pool now injects credential ${JSON.stringify(attached.name)} (${method}) on every upstream call.`;
  const extra =
    method === 'api_key' ? ' (and optionally header_name, default x-api-key)'
    : method === 'postgres_role' ? ' (leaving password out for a role that has none)'
    : '';
  return `Have the credential owner POST {${requiredFields(method).map((f) => `"${f}"`).join(', ')}}${extra} as JSON to intake_url once before expires_at; the secret goes straight into sealed storage and is attached to the pool.`;
}

export function credentialRoutes(app: TypedApp, ctx: ControlContext): void {
  app.post(
    '/api/v1/pools/:pool/auth-handoff',
    {
      schema: {
        tags: ['pools'],
        summary: 'Flip the pool to managed auth and mint a one-shot credential intake',
        params: PoolParams,
        body: AuthHandoffBody,
        response: { 200: Type.Ref('AuthHandoff'), 403: Type.Ref('Error'), 404: Type.Ref('Error'), 422: Type.Ref('Error') },
      },
    },
    async (req): Promise<AuthHandoffT> => {
      const actor = requireAbility(req, 'pools:write');
      const { auth_method: method, credential_id: credentialId = null } = req.body;
      let credentialName: string | null = null;
      if (req.body.credential_name !== undefined && req.body.credential_name !== null) {
        const n = cleanName(req.body.credential_name);
        if (!n.ok) throw unprocessable(`credential_name: ${n.reason}`);
        credentialName = n.value;
      }
      if (credentialId !== null && credentialName !== null) throw unprocessable('send credential_id or credential_name, not both');
      const now = ctx.now();

      const out = await ctx.sql.transaction(async (tx) => {
        const pool = await lockPool(tx, actor.teamId, req.params.pool);
        if (!methodFitsBackend(method, pool.backend)) throw unprocessable(backendMismatch(method, pool.backend));
        let cred: CredentialRow | null = null;
        if (credentialId !== null) cred = await referencedCredential(tx, actor.teamId, credentialId);
        else if (credentialName !== null) cred = await findCredential(tx, actor.teamId, { name: credentialName });
        if (cred) checkMethodMatch(cred, method);

        // A credential of another method no longer fits once the method changes: it is detached.
        await tx.query(
          `UPDATE pools SET managed_auth = true, auth_method = $2,
                  credential_id = CASE WHEN $3::int IS NOT NULL THEN $3::int
                                       WHEN auth_method IS DISTINCT FROM $2 THEN NULL ELSE credential_id END,
                  updated_at = $4
            WHERE id = $1`,
          [pool.id, method, cred?.id ?? null, now],
        );
        // One live intake per pool: a new handoff supersedes the links handed out before it.
        await tx.query(
          'UPDATE credential_intakes SET expires_at = $2 WHERE pool_id = $1 AND used_at IS NULL AND expires_at > $2',
          [pool.id, now],
        );
        let intake: { token: string; expiresAt: Date } | null = null;
        if (!cred) {
          const token = newIntakeToken();
          const expiresAt = new Date(now.getTime() + ctx.config.intakeTtlSeconds * 1000);
          await tx.query(
            `INSERT INTO credential_intakes (pool_id, token_hash, auth_method, credential_name, expires_at, created_at)
             VALUES ($1, $2, $3, $4, $5, $6)`,
            [pool.id, sha256Hex(token), method, credentialName, expiresAt, now],
          );
          intake = { token, expiresAt };
        }
        const after = (await findPoolById(tx, actor.teamId, pool.id))!;
        return { before: pool, after, cred, intake };
      });
      await ctx.sql.notify(CHANGE_CHANNEL, `pool:${out.after.id}`);

      return {
        pool: poolView(out.after),
        pool_created: false,
        custody_flipped: !out.before.managed_auth,
        already_attached: out.cred !== null,
        auth_method: method,
        intake_url: out.intake ? `${ctx.urls.base}/api/v1/intake/${out.intake.token}` : null,
        intake_token: out.intake?.token ?? null,
        // The pool's page, where the credential can be attached by hand.
        dashboard_url: `${ctx.urls.dashboard}/pools/${encodeURIComponent(out.after.subdomain)}`,
        expires_at: out.intake?.expiresAt.toISOString() ?? null,
        required_fields: requiredFields(method),
        auth_posture: out.after.credential_id !== null ? 'managed' : 'managed_pending_credential',
        next: nextStep(out.cred, method),
      };
    },
  );

  app.put(
    '/api/v1/pools/:pool/credential',
    {
      schema: {
        tags: ['pools'],
        summary: 'Attach a stored credential ({credential_id}) or an inline secret ({method, name?, token | api_key + header_name? | username + password})',
        params: PoolParams,
        body: AttachCredentialBody,
        response: { 200: DataOf('Pool'), 403: Type.Ref('Error'), 404: Type.Ref('Error'), 422: Type.Ref('Error') },
      },
    },
    async (req) => {
      const actor = requireAbility(req, 'pools:write');
      const body = req.body;
      const given = givenSecretFields(body);
      let name: string | null = null;
      if (body.name !== undefined) {
        const n = cleanName(body.name);
        if (!n.ok) throw unprocessable(`name: ${n.reason}`);
        name = n.value;
      }
      if (body.credential_id !== undefined && (given.length > 0 || name !== null)) {
        throw unprocessable('send credential_id to attach a stored credential, or an inline secret, not both');
      }
      if (body.credential_id === undefined && given.length === 0) {
        throw unprocessable('no secret fields: send credential_id, or method with token, api_key (+ header_name) or username + password');
      }
      const now = ctx.now();

      const poolId = await ctx.sql.transaction(async (tx) => {
        const pool = await lockPool(tx, actor.teamId, req.params.pool);
        let cred: CredentialRow | null = null;
        let method: AuthMethod;
        if (body.credential_id !== undefined) {
          cred = await referencedCredential(tx, actor.teamId, body.credential_id);
          if (body.method !== undefined) checkMethodMatch(cred, body.method);
          method = cred.method;
        } else {
          // The method may be left out when the pool already has one (or is a database pool).
          const m = body.method ?? (pool.auth_method as AuthMethod | null) ?? (pool.backend !== 'http' ? 'postgres_role' : null);
          if (m === null) throw unprocessable('method is required: one of bearer_static, api_key, basic');
          method = m;
        }
        if (pool.auth_method !== null && pool.auth_method !== method) {
          throw unprocessable(`method mismatch: the pool uses ${pool.auth_method}, the credential is ${method}`);
        }
        if (!methodFitsBackend(method, pool.backend)) throw unprocessable(backendMismatch(method, pool.backend));
        if (cred === null) {
          const checked = secretFor(method, body);
          if (!checked.ok) throw unprocessable(checked.reason);
          if (name !== null && (await findCredential(tx, actor.teamId, { name }))) throw unprocessable(`a credential named ${JSON.stringify(name)} already exists`);
          cred = await createCredential(tx, ctx.box, actor.teamId, name ?? (await freeCredentialName(tx, actor.teamId, `${pool.subdomain} ${method}`)), checked.secret);
        }
        // Attaching a credential puts the pool under managed auth with that credential's method.
        await tx.query(
          'UPDATE pools SET credential_id = $2, auth_method = $3, managed_auth = true, updated_at = $4 WHERE id = $1',
          [pool.id, cred.id, method, now],
        );
        return pool.id;
      }).catch((err: unknown) => {
        // Only a concurrent write can get here: the names were checked inside the transaction.
        if (isUniqueViolation(err)) throw unprocessable(name !== null ? `a credential named ${JSON.stringify(name)} already exists` : 'a concurrent change took the credential name; try again');
        throw err;
      });
      await ctx.sql.notify(CHANGE_CHANNEL, `pool:${poolId}`);
      const row = await findPoolById(ctx.sql, actor.teamId, poolId);
      return { data: poolView(row!) };
    },
  );
}
