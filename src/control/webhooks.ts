// Webhook destinations (spec: Webhook destinations): list, create, rotate the signing secret, attach to pools.
import { Type, type TSchema } from '@sinclair/typebox';
import { DataListOf, DataOf, type PoolWebhooksT, type WebhookEndpointT } from './schemas.js';
import { requireAbility, requireManager } from './auth.js';
import type { ControlContext, TypedApp } from './context.js';
import { ApiError, isUniqueViolation, notFound, unprocessable } from './errors.js';
import { checkTarget, type TargetPolicy } from '../security/targets.js';
import { newSigningSecret } from '../security/tokens.js';
import { createCredential, findCredential } from '../store/credentials.js';
import { findPool } from '../store/pools.js';
import { CHANGE_CHANNEL, type Queryable } from '../store/sql.js';
import {
  attachToPools,
  countWebhooks,
  enableAsync,
  findWebhook,
  insertWebhook,
  listWebhooks,
  poolWebhookIds,
  replacePoolWebhooks,
  setSigningSecret,
  teamPoolIds,
  teamWebhookIds,
  webhookNameTaken,
  webhookView,
  replayDelivery,
  recoverDeliveries,
  type WebhookRow,
} from '../store/webhooks.js';

const Nullable = <T extends TSchema>(s: T) => Type.Union([s, Type.Null()]);
const Id = Type.Integer({ minimum: 1, maximum: 2147483647 });
const IdList = Type.Array(Id, { maxItems: 1000 });

const CreateBody = Type.Object(
  {
    name: Type.String({ minLength: 1, maxLength: 60 }),
    url: Type.String({ minLength: 1, maxLength: 500 }),
    description: Type.Optional(Nullable(Type.String({ maxLength: 200 }))),
    pool_ids: Type.Optional(IdList),
    credential_id: Type.Optional(Nullable(Id)),
    auth_header: Type.Optional(Nullable(Type.String({ minLength: 1, maxLength: 64 }))),
    new_credential: Type.Optional(
      Nullable(
        Type.Object(
          {
            name: Type.String({ minLength: 1, maxLength: 60 }),
            bearer_token: Type.String({ minLength: 1, maxLength: 4000 }),
          },
          { additionalProperties: false },
        ),
      ),
    ),
  },
  { additionalProperties: false },
);

const AttachBody = Type.Object({ webhook_endpoint_ids: IdList }, { additionalProperties: false });
const WebhookParams = Type.Object({ webhookEndpoint: Id });
const PoolParams = Type.Object({ pool: Type.String({ minLength: 1, maxLength: 63 }) });
const ReplayParams = Type.Object({ webhookEndpoint: Id, jobId: Type.String({ minLength: 1, maxLength: 100, pattern: '^[A-Za-z0-9_-]+$' }) });
const RecoverBody = Type.Object(
  { since: Type.String({ format: 'date-time', description: 'deliveries whose event entered the outbox at or after this time' }) },
  { additionalProperties: false },
);

/** Plans that admit async pools and webhooks (spec: Limits, async admission). */
const ASYNC_PLANS: ReadonlySet<string> = new Set(['team', 'business']);

// RFC 9110 token characters, lower-case only (header names are case-insensitive; we store one spelling).
const HEADER_NAME = /^[a-z0-9!#$%&'*+.^_`|~-]+$/;
// Headers the deliverer sets itself or that describe the connection, not the request.
const RESERVED_HEADERS: ReadonlySet<string> = new Set([
  'host', 'content-length', 'content-type', 'content-encoding', 'transfer-encoding', 'connection',
  'keep-alive', 'te', 'trailer', 'upgrade', 'proxy-authorization', 'proxy-connection',
]);

const errorResponses = { 403: Type.Ref('Error'), 404: Type.Ref('Error'), 422: Type.Ref('Error'), 503: Type.Ref('Error') };

/** A projection to the data plane failed: the transaction rolls back and the client gets 503. */
class ProjectionError extends Error {
  override name = 'ProjectionError';
}

/** Default projection: NOTIFY through the transaction, delivered to the data plane only if it commits. */
async function notifyChange(tx: Queryable, change: string): Promise<void> {
  await tx.query('SELECT pg_notify($1, $2)', [CHANGE_CHANNEL, change]);
}

type Project = (change: string) => Promise<void>;

/**
 * Runs a config write and its projection to the data plane in one transaction. When the projection
 * fails, nothing is written and the client is told so with 503 and `failMessage`.
 */
export async function writeAndProject<T>(ctx: ControlContext, failMessage: string, fn: (tx: Queryable, project: Project) => Promise<T>): Promise<T> {
  const projectFn = ctx.project ?? notifyChange;
  try {
    return await ctx.sql.transaction((tx) =>
      fn(tx, async (change) => {
        try {
          await projectFn(tx, change);
        } catch (err) {
          throw new ProjectionError(`projecting ${change} failed`, { cause: err });
        }
      }),
    );
  } catch (err) {
    if (err instanceof ProjectionError) {
      ctx.log.error({ err }, 'edge projection failed; write rolled back');
      throw new ApiError('unavailable', failMessage, { cause: err });
    }
    throw err;
  }
}

/** The plan of the team, with the team row locked so caps and plan checks hold until commit. */
async function lockTeamPlan(tx: Queryable, teamId: number): Promise<string> {
  const { rows } = await tx.query<{ plan: string }>('SELECT plan FROM teams WHERE id = $1 FOR UPDATE', [teamId]);
  return rows[0]!.plan;
}

function requireAsyncPlan(plan: string): void {
  if (!ASYNC_PLANS.has(plan)) {
    throw unprocessable(`webhook destinations and async pools need the Team or Business plan; this organization is on the ${plan} plan`);
  }
}

/** A webhook URL the deliverer may call: https, no userinfo or fragment, a public host that is not this service. */
export async function checkWebhookUrl(raw: string, targets: TargetPolicy): Promise<string> {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    throw unprocessable('url is not a valid absolute URL');
  }
  if (u.protocol !== 'https:') throw unprocessable('url must use https');
  if (u.username || u.password) throw unprocessable('url must not carry user:password; use credential_id or new_credential for delivery auth');
  if (u.hash) throw unprocessable('url must not have a #fragment (it is never sent)');
  const verdict = await checkTarget(u.hostname, targets);
  if (!verdict.ok) throw unprocessable(`url host refused: ${verdict.reason}`);
  // The normalised form is what deliveries call, so it is what we store and show.
  if (u.href.length > 500) throw unprocessable('url must NOT have more than 500 characters');
  return u.href;
}

function checkAuthHeader(name: string | null, hasCredential: boolean): string | null {
  if (name === null) return null;
  if (!hasCredential) throw unprocessable('auth_header is used only with credential_id or new_credential');
  if (!HEADER_NAME.test(name)) throw unprocessable('auth_header must be a lower-case HTTP header name');
  if (RESERVED_HEADERS.has(name) || name.startsWith('x-service-')) throw unprocessable(`auth_header ${JSON.stringify(name)} is reserved for the delivery itself`);
  return name;
}

const unique = (ids: readonly number[]): number[] => [...new Set(ids)];

/** Replay and recover send to the destination now: a deactivated one would only keep them waiting. */
function requireActive(row: WebhookRow): void {
  if (row.disabled) throw unprocessable(`webhook destination ${row.id} is deactivated; re-enable it first (poolgate admin webhook enable)`);
}

export function webhookRoutes(app: TypedApp, ctx: ControlContext): void {
  app.get(
    '/api/v1/webhooks',
    { schema: { tags: ['webhooks'], summary: 'Webhook destinations of the organization', response: { 200: DataListOf('WebhookEndpoint') } } },
    async (req) => {
      const actor = requireAbility(req, 'pools:read');
      return { data: (await listWebhooks(ctx.sql, actor.teamId)).map(webhookView) };
    },
  );

  app.post(
    '/api/v1/webhooks',
    {
      schema: {
        tags: ['webhooks'],
        summary: 'Create a webhook destination (signing secret shown once)',
        body: CreateBody,
        response: { 201: DataOf('WebhookEndpoint'), ...errorResponses },
      },
    },
    async (req, reply) => {
      const actor = requireAbility(req, 'pools:write');
      requireManager(actor);
      const b = req.body;
      const name = b.name.trim();
      if (name === '') throw unprocessable('name must not be blank');
      const credentialId = b.credential_id ?? null;
      const newCredential = b.new_credential ?? null;
      if (credentialId !== null && newCredential !== null) throw unprocessable('send credential_id or new_credential, not both');
      const authHeader = checkAuthHeader(b.auth_header ?? null, credentialId !== null || newCredential !== null);
      const url = await checkWebhookUrl(b.url, ctx.targets);
      const poolIds = unique(b.pool_ids ?? []);
      const secret = newSigningSecret();

      let created: WebhookEndpointT;
      try {
        created = await writeAndProject(ctx, 'edge projection failed, webhook destination not created', async (tx, project) => {
          requireAsyncPlan(await lockTeamPlan(tx, actor.teamId));
          if ((await countWebhooks(tx, actor.teamId)) >= ctx.config.maxWebhookDestinations) {
            throw unprocessable(`cap reached: an organization may have at most ${ctx.config.maxWebhookDestinations} webhook destinations`);
          }
          if (await webhookNameTaken(tx, actor.teamId, name)) throw unprocessable(`name ${JSON.stringify(name)} is already taken`);
          const found = await teamPoolIds(tx, actor.teamId, poolIds);
          const missing = poolIds.find((id) => !found.has(id));
          if (missing !== undefined) throw unprocessable(`pool_ids: pool ${missing} not found`);

          let attachCredential: number | null = null;
          if (credentialId !== null) {
            const cred = await findCredential(tx, actor.teamId, { id: credentialId });
            if (!cred) throw unprocessable(`credential_id: credential ${credentialId} not found`);
            if (cred.method !== 'bearer_static') throw unprocessable(`credential_id: credential ${credentialId} is ${cred.method}; webhook auth needs bearer_static`);
            attachCredential = cred.id;
          } else if (newCredential !== null) {
            const credName = newCredential.name.trim();
            if (credName === '') throw unprocessable('new_credential.name must not be blank');
            if (await findCredential(tx, actor.teamId, { name: credName })) throw unprocessable(`new_credential.name ${JSON.stringify(credName)} is already taken`);
            attachCredential = (await createCredential(tx, ctx.box, actor.teamId, credName, { method: 'bearer_static', token: newCredential.bearer_token })).id;
          }

          const id = await insertWebhook(tx, {
            teamId: actor.teamId,
            name,
            description: b.description ?? null,
            url,
            signingSecretEnc: ctx.box.seal(secret),
            credentialId: attachCredential,
            authHeader,
          });
          await attachToPools(tx, id, poolIds);
          const switched = await enableAsync(tx, poolIds);
          await project(`webhook:${id}`);
          for (const poolId of poolIds) await project(`pool:${poolId}`);
          const row = (await findWebhook(tx, actor.teamId, id))!;
          return { ...webhookView(row), signing_secret: secret, async_enabled_on_pool_ids: switched };
        });
      } catch (err) {
        // A concurrent create took the name (or the credential name) between our check and our insert.
        if (isUniqueViolation(err)) throw new ApiError('unprocessable', 'name is already taken', { cause: err });
        throw err;
      }
      return reply.code(201).send({ data: created });
    },
  );

  app.post(
    '/api/v1/webhooks/:webhookEndpoint/rotate',
    {
      schema: {
        tags: ['webhooks'],
        summary: 'Rotate the signing secret (new secret shown once)',
        params: WebhookParams,
        response: { 200: DataOf('WebhookEndpoint'), ...errorResponses },
      },
    },
    async (req) => {
      const actor = requireAbility(req, 'pools:write');
      requireManager(actor);
      const secret = newSigningSecret();
      const rotated = await writeAndProject(ctx, 'edge projection failed, signing key unchanged', async (tx, project) => {
        const row = await findWebhook(tx, actor.teamId, req.params.webhookEndpoint, true);
        if (!row) throw notFound('webhook destination');
        await setSigningSecret(tx, row.id, ctx.box.seal(secret));
        await project(`webhook:${row.id}`);
        return { ...webhookView(row), signing_secret: secret };
      });
      return { data: rotated };
    },
  );

  app.put(
    '/api/v1/pools/:pool/webhooks',
    {
      schema: {
        tags: ['webhooks'],
        summary: 'Replace the webhook destinations attached to a pool',
        params: PoolParams,
        body: AttachBody,
        response: { 200: DataOf('PoolWebhooks'), ...errorResponses },
      },
    },
    async (req) => {
      const actor = requireAbility(req, 'pools:write');
      requireManager(actor);
      const ids = unique(req.body.webhook_endpoint_ids);
      const view = await writeAndProject(ctx, 'edge projection failed, attachments unchanged', async (tx, project): Promise<PoolWebhooksT> => {
        const pool = await findPool(tx, actor.teamId, req.params.pool);
        if (!pool) throw notFound('pool');
        await tx.query('SELECT 1 FROM pools WHERE id = $1 FOR UPDATE', [pool.id]);
        // Detaching everything is always allowed, so a downgraded organization can still clean up.
        if (ids.length > 0) {
          requireAsyncPlan(await lockTeamPlan(tx, actor.teamId));
          if (ids.length > ctx.config.maxWebhookDestinations) {
            throw unprocessable(`cap reached: a pool may have at most ${ctx.config.maxWebhookDestinations} webhook destinations`);
          }
          const found = await teamWebhookIds(tx, actor.teamId, ids);
          const missing = ids.find((id) => !found.has(id));
          if (missing !== undefined) throw unprocessable(`webhook_endpoint_ids: webhook destination ${missing} not found`);
        }
        await replacePoolWebhooks(tx, pool.id, ids);
        await enableAsync(tx, ids.length > 0 ? [pool.id] : []);
        await project(`pool:${pool.id}`);
        const { rows } = await tx.query<{ async_enabled: boolean; async_on_queue: boolean }>(
          'SELECT async_enabled, async_on_queue FROM pools WHERE id = $1',
          [pool.id],
        );
        return {
          pool_id: pool.id,
          subdomain: pool.subdomain,
          webhook_endpoint_ids: await poolWebhookIds(tx, pool.id),
          async_enabled: rows[0]!.async_enabled,
          async_on_queue: rows[0]!.async_on_queue,
        };
      });
      return { data: view };
    },
  );

  // Beyond the spec: Svix's resend and recover.
  app.post(
    '/api/v1/webhooks/:webhookEndpoint/deliveries/:jobId/replay',
    {
      schema: {
        tags: ['webhooks'],
        summary: 'Replay one delivery: sent again now, same job id and body, signed with the current secret (beyond the spec)',
        params: ReplayParams,
        response: { 202: DataListOf('WebhookReplay'), ...errorResponses },
      },
    },
    async (req, reply) => {
      const actor = requireAbility(req, 'pools:write');
      requireManager(actor);
      const row = await findWebhook(ctx.sql, actor.teamId, req.params.webhookEndpoint);
      if (!row) throw notFound('webhook destination');
      requireActive(row);
      const replayed = await replayDelivery(ctx.sql, row.id, req.params.jobId);
      if (!replayed) throw notFound(`delivery of job ${req.params.jobId} to this destination (or it is past its retention)`);
      return reply.code(202).send({ data: replayed.map((r) => ({ webhook_endpoint_id: row.id, ...r })) });
    },
  );

  app.post(
    '/api/v1/webhooks/:webhookEndpoint/recover',
    {
      schema: {
        tags: ['webhooks'],
        summary: 'Recover: send again every delivery given up since a time (beyond the spec)',
        params: WebhookParams,
        body: RecoverBody,
        response: { 202: DataOf('WebhookRecover'), ...errorResponses },
      },
    },
    async (req, reply) => {
      const actor = requireAbility(req, 'pools:write');
      requireManager(actor);
      const since = new Date(req.body.since);
      if (Number.isNaN(since.getTime())) throw unprocessable('since must be a date-time');
      const row = await findWebhook(ctx.sql, actor.teamId, req.params.webhookEndpoint);
      if (!row) throw notFound('webhook destination');
      requireActive(row);
      const recovered = await recoverDeliveries(ctx.sql, row.id, since);
      return reply.code(202).send({ data: { webhook_endpoint_id: row.id, since: since.toISOString(), recovered } });
    },
  );
}
