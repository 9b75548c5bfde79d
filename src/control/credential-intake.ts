// The one-shot credential intake minted by auth-handoff: POST /api/v1/intake/:token takes the secret
// fields once, before expiry, seals them into a credential and attaches it to the pool. The intake
// token is the authority (no API token), so the secret never has to pass through the token's holder.
import { Type } from '@sinclair/typebox';
import type { ControlContext, TypedApp } from './context.js';
import { ApiError, isUniqueViolation, notFound, unprocessable } from './errors.js';
import { DataOf, type AuthMethod } from './schemas.js';
import { freeCredentialName, requiredFields, secretFor, SecretFieldProps } from './credential-fields.js';
import { sendPage } from '../dashboard/serve.js';
import { sha256Hex } from '../security/tokens.js';
import { createCredential, findCredential } from '../store/credentials.js';
import { findPoolById, poolView } from '../store/pools.js';
import { CHANGE_CHANNEL } from '../store/sql.js';

const IntakeParams = Type.Object({ token: Type.String({ pattern: '^pgi_[A-Za-z0-9]{40}$' }) });
const IntakeBody = Type.Object(SecretFieldProps, { additionalProperties: false });

interface IntakeRow {
  id: number;
  pool_id: number;
  auth_method: AuthMethod;
  credential_name: string | null;
  expires_at: Date;
  used_at: Date | null;
  team_id: number;
  subdomain: string;
}

const gone = (message: string) => new ApiError('gone', message);

const IntakeForm = Type.Object(
  {
    pool: Type.Object({ name: Type.String(), subdomain: Type.String() }, { additionalProperties: false }),
    auth_method: Type.String(),
    required_fields: Type.Array(Type.String()),
    optional_fields: Type.Array(Type.String()),
    expires_at: Type.String({ format: 'date-time' }),
  },
  { additionalProperties: false },
);

/** A browser (Accept prefers text/html) gets the intake form page; any other client gets JSON. */
const wantsHtml = (accept: string | undefined): boolean => {
  if (!accept) return false;
  const html = accept.indexOf('text/html');
  const json = accept.indexOf('application/json');
  return html >= 0 && (json < 0 || html < json);
};

export function intakeRoutes(app: TypedApp, ctx: ControlContext): void {
  app.get(
    '/api/v1/intake/:token',
    {
      config: { public: true },
      schema: {
        tags: ['pools'],
        summary: 'What the one-shot intake asks for (a browser gets the HTML form instead)',
        description: 'Extension of the service spec: opening intake_url in a browser shows a form with the fields of the handoff\'s method; it posts them to the same address. Reading does not spend the link.',
        security: [],
        params: IntakeParams,
        response: { 200: IntakeForm, 404: Type.Ref('Error'), 410: Type.Ref('Error') },
      },
    },
    async (req, reply) => {
      if (wantsHtml(req.headers.accept)) return sendPage(reply, 'intake');
      const { rows } = await ctx.sql.query<IntakeRow & { name: string }>(
        `SELECT i.auth_method, i.expires_at, i.used_at, p.name, p.subdomain
           FROM credential_intakes i JOIN pools p ON p.id = i.pool_id
          WHERE i.token_hash = $1 AND p.status <> 'deleted'`,
        [sha256Hex(req.params.token)],
      );
      const intake = rows[0];
      if (!intake) throw notFound('intake');
      if (intake.used_at) throw gone('this intake link was already used; run the auth handoff again for a new one');
      if (new Date(intake.expires_at).getTime() <= ctx.now().getTime()) throw gone('this intake link has expired or was superseded; run the auth handoff again for a new one');
      return reply.send({
        pool: { name: intake.name, subdomain: intake.subdomain },
        auth_method: intake.auth_method,
        required_fields: requiredFields(intake.auth_method),
        optional_fields: intake.auth_method === 'api_key' ? ['header_name'] : [],
        expires_at: new Date(intake.expires_at).toISOString(),
      });
    },
  );

  app.post(
    '/api/v1/intake/:token',
    {
      config: { public: true },
      schema: {
        tags: ['pools'],
        summary: 'One-shot credential intake (the intake token in the path is the authority)',
        security: [],
        params: IntakeParams,
        body: IntakeBody,
        response: { 200: DataOf('Pool'), 404: Type.Ref('Error'), 410: Type.Ref('Error'), 422: Type.Ref('Error') },
      },
    },
    async (req) => {
      const now = ctx.now();
      const out = await ctx.sql.transaction(async (tx) => {
        // FOR UPDATE: two concurrent posts of the same token cannot both spend it.
        const { rows } = await tx.query<IntakeRow>(
          `SELECT i.id, i.pool_id, i.auth_method, i.credential_name, i.expires_at, i.used_at, p.team_id, p.subdomain
             FROM credential_intakes i JOIN pools p ON p.id = i.pool_id
            WHERE i.token_hash = $1 AND p.status <> 'deleted'
            FOR UPDATE OF i`,
          [sha256Hex(req.params.token)],
        );
        const intake = rows[0];
        if (!intake) throw notFound('intake');
        if (intake.used_at) throw gone('this intake link was already used; run the auth handoff again for a new one');
        if (new Date(intake.expires_at).getTime() <= now.getTime()) throw gone('this intake link has expired or was superseded; run the auth handoff again for a new one');

        // Validation failures roll back and leave the intake usable for a corrected post.
        const checked = secretFor(intake.auth_method, req.body);
        if (!checked.ok) throw unprocessable(checked.reason);
        let name = intake.credential_name;
        if (name !== null && (await findCredential(tx, intake.team_id, { name }))) {
          throw unprocessable(`a credential named ${JSON.stringify(name)} was created meanwhile; run the auth handoff again`);
        }
        name ??= await freeCredentialName(tx, intake.team_id, `${intake.subdomain} ${intake.auth_method}`);
        const cred = await createCredential(tx, ctx.box, intake.team_id, name, checked.secret);
        await tx.query('UPDATE pools SET credential_id = $2, updated_at = $3 WHERE id = $1', [intake.pool_id, cred.id, now]);
        await tx.query('UPDATE credential_intakes SET used_at = $2 WHERE id = $1', [intake.id, now]);
        return intake;
      }).catch((err: unknown) => {
        if (isUniqueViolation(err)) throw unprocessable('a credential with that name was created meanwhile; post again');
        throw err;
      });
      await ctx.sql.notify(CHANGE_CHANNEL, `pool:${out.pool_id}`);
      const row = await findPoolById(ctx.sql, out.team_id, out.pool_id);
      return { data: poolView(row!) };
    },
  );
}
