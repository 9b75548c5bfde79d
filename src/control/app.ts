// Control API app factory: JSON only, bearer-token auth, strict body validation, `{ message }` errors,
// and an OpenAPI 3.1.0 document generated from the same route schemas. listen() lives in the start-up module.
import Fastify, { type FastifyInstance, type FastifyError, type FastifyReply, type FastifyRequest } from 'fastify';
import swagger from '@fastify/swagger';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { ApiError } from './errors.js';
import { httpStatus } from '../errors/catalogue.js';
import { ActorCache, authenticateRequest } from './auth.js';
import { CHANGE_CHANNEL } from '../store/sql.js';
import { hasUnstorableText } from './unstorable-text.js';
import { clientErrorHandler } from './client-errors.js';
import type { ControlContext } from './context.js';
import { sharedSchemas } from './schemas.js';
import { identityRoutes } from './identity.js';
import { budgetRoutes } from './budgets.js';
import { poolRoutes } from './pools.js';
import { credentialRoutes } from './credential-attach.js';
import { intakeRoutes } from './credential-intake.js';
import { webhookRoutes } from './webhooks.js';
import { keyRoutes } from './keys.js';
import { metricsRoutes } from './metrics.js';
import { settingsRoutes } from './settings.js';
import { HEALTH_PATHS, healthAnswer } from '../health.js';
import { isStoreUnreachable } from '../store/unreachable.js';
import { sessionRoutes, DashboardSession } from './session.js';
import { liveRoutes, PoolLive, MinuteRollup } from './live.js';
import { webhookActionRoutes, DeliveryAttempt } from './webhook-actions.js';
import { dashboardRoutes } from '../dashboard/serve.js';
import { SchemaCompilers } from './schema-compilers.js';

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Routes that need no API token (the OpenAPI document, the one-shot intake). */
    public?: boolean;
    /** The body may be absent (spec: "body optional"); the OpenAPI document then says requestBody is not required. */
    bodyOptional?: boolean;
  }
  interface FastifyInstance {
    /** The validators and serializers, compiled at each route's first request (compileAll: every one now). */
    schemaCompilers: SchemaCompilers;
  }
}

export type ControlApp = FastifyInstance;

function describeValidation(err: FastifyError, schema: unknown): string {
  const first = err.validation?.[0];
  if (!first) return err.message;
  const where = `${err.validationContext ?? 'body'}${first.instancePath ? first.instancePath.replaceAll('/', '.') : ''}`;
  if (first.keyword === 'additionalProperties') {
    return `${where}: unknown property ${JSON.stringify((first.params as { additionalProperty: string }).additionalProperty)}`;
  }
  // A number out of range is told its whole range, as the CLI and the dashboard say it (issue 26 item 5):
  // "must be an integer from 1 to 100000", never one bound at a time.
  if (first.keyword === 'minimum' || first.keyword === 'maximum' || first.keyword === 'type') {
    const range = rangeOf(schema, first.instancePath);
    if (range) return `${where} must be ${range}`;
  }
  return `${where} ${first.message ?? 'is invalid'}`;
}

/** "an integer from MIN to MAX" for the integer the path names in the route's schema, when both bounds are known. */
function rangeOf(schema: unknown, path: string): string | null {
  let s = schema as { properties?: Record<string, unknown>; anyOf?: unknown[] } | undefined;
  for (const part of path.split('/').slice(1)) s = s?.properties?.[part] as typeof s;
  // Optional(Union([Integer, Null])) has the integer in an anyOf.
  const int = [s, ...(s?.anyOf ?? [])].find((x) => (x as { type?: string } | undefined)?.type === 'integer') as { minimum?: number; maximum?: number } | undefined;
  if (int?.minimum === undefined || int.maximum === undefined) return null;
  return `an integer from ${int.minimum} to ${int.maximum}`;
}

export async function buildControlApp(ctx: ControlContext): Promise<ControlApp> {
  const app = Fastify({
    logger: false,
    bodyLimit: ctx.config.controlBodyLimit,
    return503OnClosing: true,
    routerOptions: { caseSensitive: true, ignoreTrailingSlash: false, maxParamLength: 200 },
    clientErrorHandler,
    // Router-level refusals bypass the error handler; keep them in the `{ message }` shape (an over-long id addresses nothing).
    frameworkErrors: (err: FastifyError, _req: FastifyRequest, reply: FastifyReply) => {
      const status = err.code === 'FST_ERR_BAD_URL' ? 400 : err.code === 'FST_ERR_MAX_PARAM_LENGTH' ? 404 : 500;
      void reply.code(status).send({ message: status === 400 ? 'the request path is not valid URL encoding' : status === 404 ? 'not found' : 'internal error' });
    },
  }).withTypeProvider<TypeBoxTypeProvider>();

  // Bodies are validated exactly (no coercion, no silent stripping); path and query strings are coerced.
  const shared = [...sharedSchemas, DashboardSession, PoolLive, MinuteRollup, DeliveryAttempt];
  for (const s of shared) app.addSchema(s);
  const compilers = new SchemaCompilers(shared);
  app.setValidatorCompiler(compilers.validator);
  app.setSerializerCompiler(compilers.serializer);
  app.decorate('schemaCompilers', compilers);

  // JSON bodies only; an empty body means "no body" (for endpoints whose body is optional).
  app.removeAllContentTypeParsers();
  app.addContentTypeParser(/^application\/(?:[\w.+-]+\+)?json$/i, { parseAs: 'string' }, (_req, text, done) => {
    const s = (text as string).trim();
    if (s === '') return done(null, undefined);
    let body: unknown;
    let protoKey = false;
    try {
      body = JSON.parse(s, (k, v) => {
        if (k === '__proto__') protoKey = true;
        return v;
      });
    } catch {
      return done(new ApiError('bad_request', 'request body is not valid JSON'), undefined);
    }
    // Refused, not silently dropped: a body the handler would see differently from what was sent is not valid input.
    if (protoKey) return done(new ApiError('unprocessable', 'body: unknown property "__proto__"'), undefined);
    done(null, body);
  });

  // Token and role changes (revoke, user role) arrive on the change feed and drop every cached actor.
  const actors = new ActorCache();
  const unlisten = await ctx.sql.listen(CHANGE_CHANNEL, (payload) => {
    if (payload.startsWith('token:') || payload.startsWith('user:')) actors.clear();
  });
  app.addHook('onClose', async () => unlisten());

  app.decorateRequest('actor', null);
  app.addHook('onRequest', async (req: FastifyRequest) => {
    if (req.routeOptions.config?.public) return;
    // Unknown routes fall through to the not-found handler after auth, so paths are not probeable without a token.
    req.actor = await authenticateRequest(ctx.sql, req, ctx.now(), actors);
  });
  // One line per Control API request (issue 20): the route pattern (never the path: an intake token travels in it),
  // the pool, the status, the time and the API token's id (never the token). Health probes are not logged.
  app.addHook('onResponse', async (req: FastifyRequest, reply: FastifyReply) => {
    const route = req.routeOptions.url;
    if (route !== undefined && (HEALTH_PATHS as readonly string[]).includes(route)) return;
    const status = reply.statusCode;
    const line = {
      event: 'control', method: req.method, route: route ?? null, pool: (req.params as { pool?: string } | undefined)?.pool,
      status, ms: Math.round(reply.elapsedTime), tokenId: req.actor?.tokenId, teamId: req.actor?.teamId, peer: req.ip,
    };
    if (status >= 500) ctx.log.error(line, 'control api request');
    else ctx.log.info(line, 'control api request');
  });
  // NUL or an unpaired surrogate would fail (or be mangled) in the store: refuse it as bad input, never a 5xx.
  app.addHook('preValidation', async (req: FastifyRequest) => {
    if (hasUnstorableText(req.params)) throw new ApiError('not_found', 'not found');
    if (hasUnstorableText(req.query) || hasUnstorableText(req.body)) {
      throw new ApiError('unprocessable', 'text must not contain NUL characters or unpaired UTF-16 surrogates');
    }
  });

  app.setErrorHandler((err: FastifyError, req: FastifyRequest, reply: FastifyReply) => {
    if (err instanceof ApiError) return reply.code(err.statusCode).send({ message: err.message });
    if (err.validation) {
      if (err.validationContext === 'params') return reply.code(httpStatus('not_found')).send({ message: 'not found' });
      const schema = err.validationContext === 'body' ? req.routeOptions.schema?.body : err.validationContext === 'querystring' ? req.routeOptions.schema?.querystring : undefined;
      return reply.code(httpStatus('unprocessable')).send({ message: describeValidation(err, schema) });
    }
    const status = err.statusCode ?? 500;
    if (status >= 400 && status < 500) {
      const message =
        status === 413 ? `request body is too large (more than ${ctx.config.controlBodyLimit} bytes; the operator sets it: POOLGATE_CONTROL_BODY_LIMIT)`
        : status === 415 ? 'unsupported content type: send application/json'
        : err.message;
      return reply.code(status).send({ message });
    }
    if (isStoreUnreachable(err)) {
      // The store is down or failing over: not poolgate's fault nor the client's, and over by itself.
      ctx.log.warn({ err, method: req.method, url: req.url }, 'control api: the store cannot be reached');
      return reply.code(httpStatus('unavailable')).header('retry-after', '1').send({ message: 'the store (PostgreSQL) cannot be reached right now; poolgate reconnects by itself: retry shortly' });
    }
    ctx.log.error({ err, method: req.method, url: req.url }, 'control api internal error');
    return reply.code(httpStatus('internal_error')).send({ message: 'internal error' });
  });
  app.setNotFoundHandler((_req, reply) => reply.code(httpStatus('not_found')).send({ message: 'route not found' }));

  // @fastify/swagger marks every declared body as required; routes with an optional body say so in their config.
  const optionalBodies = new Set<string>();
  app.addHook('onRoute', (route) => {
    if (!route.config?.bodyOptional) return;
    for (const m of [route.method].flat()) optionalBodies.add(`${String(m).toLowerCase()} ${route.url.replace(/:(\w+)/g, '{$1}')}`);
  });

  await app.register(swagger, {
    transformObject: (doc) => {
      const paths = ('openapiObject' in doc ? doc.openapiObject.paths : undefined) ?? {};
      for (const [path, item] of Object.entries(paths)) {
        for (const [method, op] of Object.entries(item ?? {})) {
          const body = (op as { requestBody?: { required?: boolean } }).requestBody;
          if (body && optionalBodies.has(`${method} ${path}`)) body.required = false;
        }
      }
      return 'openapiObject' in doc ? doc.openapiObject : doc.swaggerObject;
    },
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'poolgate Control API',
        version: '1.0.0',
        description: 'Management plane of poolgate: budgets, pools, pool keys, webhook destinations, metrics.',
      },
      components: {
        securitySchemes: {
          bearer: { type: 'http', scheme: 'bearer' },
          // The dashboard's alternative: the session cookie set by POST /api/v1/session (with X-CSRF-Token on changes).
          session: { type: 'apiKey', in: 'cookie', name: 'poolgate_session' },
        },
      },
      security: [{ bearer: [] }, { session: [] }],
    },
    refResolver: { buildLocalReference: (json, _base, _fragment, i) => String(json.$id ?? `def-${i}`) },
  });

  app.get('/api/v1/openapi.json', { config: { public: true }, schema: { hide: true } }, async () => ({ ...app.swagger(), servers: [{ url: ctx.urls.base }] }));

  const health = ctx.health;
  if (health) {
    for (const path of HEALTH_PATHS) {
      app.get(path, { config: { public: true }, schema: { hide: true } }, async (_req, reply) => {
        const { status, body } = await healthAnswer(health, path);
        return reply.code(status).header('cache-control', 'no-store').send(body);
      });
    }
  }

  identityRoutes(app, ctx);
  budgetRoutes(app, ctx);
  poolRoutes(app, ctx);
  credentialRoutes(app, ctx);
  intakeRoutes(app, ctx);
  webhookRoutes(app, ctx);
  keyRoutes(app, ctx);
  metricsRoutes(app, ctx);
  settingsRoutes(app, ctx);
  sessionRoutes(app, ctx);
  liveRoutes(app, ctx);
  webhookActionRoutes(app, ctx);
  dashboardRoutes(app);

  await app.ready();
  return app;
}
