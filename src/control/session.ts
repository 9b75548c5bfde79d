// Dashboard sessions on the Control API: POST /api/v1/session trades an API token (pasted once) or a
// one-time sign-in link for an HttpOnly, SameSite=Strict cookie bound to a server-side session;
// GET tells the page its CSRF token; DELETE signs out. The token itself never reaches a URL or the page.
import { Type } from '@sinclair/typebox';
import type { FastifyReply } from 'fastify';
import type { ControlContext, TypedApp } from './context.js';
import { actorOf, cookieValue, csrfTokenOf, SESSION_COOKIE } from './auth.js';
import { ApiError, unauthorized } from './errors.js';
import { endSession, sessionFromLink, sessionFromToken, type OpenedSession } from '../store/sessions.js';

export const DashboardSession = Type.Object(
  {
    csrf_token: Type.String({ description: 'Send it as X-CSRF-Token on every state-changing call made with the session cookie.' }),
    expires_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
    user_id: Type.Integer(),
    team_id: Type.Integer(),
    abilities: Type.Array(Type.String()),
  },
  { $id: 'DashboardSession', additionalProperties: false },
);

const SignInBody = Type.Union(
  [
    Type.Object({ token: Type.String({ minLength: 1, maxLength: 200 }) }, { additionalProperties: false }),
    Type.Object({ login_link: Type.String({ pattern: '^pgl_[A-Za-z0-9]{40}$' }) }, { additionalProperties: false }),
  ],
  { description: 'An API token, or the secret of a one-time sign-in link (`poolgate admin login-link`).' },
);

function setCookie(reply: FastifyReply, value: string, maxAgeS: number, secure: boolean): void {
  // Path=/ so the Control API under /api/v1 receives it; SameSite=Strict keeps other sites' requests cookieless.
  const parts = [`${SESSION_COOKIE}=${value}`, 'Path=/', 'HttpOnly', 'SameSite=Strict', `Max-Age=${maxAgeS}`];
  if (secure) parts.push('Secure');
  void reply.header('set-cookie', parts.join('; '));
}

export function sessionRoutes(app: TypedApp, ctx: ControlContext): void {
  const secure = () => ctx.urls.dashboard.startsWith('https:');

  app.post(
    '/api/v1/session',
    {
      config: { public: true },
      schema: {
        tags: ['dashboard'],
        summary: 'Sign in to the dashboard: sets the HttpOnly session cookie',
        description: 'Extension of the service spec. The body is an API token (the session gets its abilities and ends no later than it) or a one-time sign-in link (spent by this call).',
        security: [],
        body: SignInBody,
        response: { 201: Type.Ref('DashboardSession'), 401: Type.Ref('Error'), 410: Type.Ref('Error'), 422: Type.Ref('Error') },
      },
    },
    async (req, reply) => {
      const now = ctx.now();
      let opened: OpenedSession;
      if ('token' in req.body) {
        const s = await sessionFromToken(ctx.sql, req.body.token, now);
        if (!s) throw unauthorized();
        opened = s;
      } else {
        const s = await sessionFromLink(ctx.sql, req.body.login_link, now);
        if (s === 'unknown') throw unauthorized('this sign-in link is not valid');
        if (s === 'used') throw new ApiError('gone', 'this sign-in link was already used; ask for a new one');
        if (s === 'expired') throw new ApiError('gone', 'this sign-in link has expired; ask for a new one');
        opened = s;
      }
      setCookie(reply, opened.secret, Math.max(1, Math.floor((opened.expiresAt.getTime() - now.getTime()) / 1000)), secure());
      return reply.code(201).send({
        csrf_token: csrfTokenOf(opened.secret),
        expires_at: opened.expiresAt.toISOString(),
        user_id: opened.userId,
        team_id: opened.teamId,
        abilities: opened.abilities,
      });
    },
  );

  app.get(
    '/api/v1/session',
    {
      schema: {
        tags: ['dashboard'],
        summary: 'The dashboard session of the cookie, with its CSRF token',
        description: 'Extension of the service spec. Answers 401 without a live session cookie (a bearer token has no session).',
        response: { 200: Type.Ref('DashboardSession'), 401: Type.Ref('Error') },
      },
    },
    async (req) => {
      const actor = actorOf(req);
      const secret = req.headers.authorization === undefined ? cookieValue(req.headers.cookie, SESSION_COOKIE) : null;
      if (!secret) throw unauthorized('no dashboard session: sign in with POST /api/v1/session');
      return { csrf_token: csrfTokenOf(secret), expires_at: null, user_id: actor.userId, team_id: actor.teamId, abilities: [...actor.abilities].sort() };
    },
  );

  app.delete(
    '/api/v1/session',
    {
      schema: {
        tags: ['dashboard'],
        summary: 'Sign out: ends the session on the server and clears the cookie',
        description: 'Extension of the service spec. Needs the session cookie and its X-CSRF-Token.',
        response: { 204: Type.Null(), 401: Type.Ref('Error'), 403: Type.Ref('Error') },
      },
    },
    async (req, reply) => {
      actorOf(req);
      const secret = req.headers.authorization === undefined ? cookieValue(req.headers.cookie, SESSION_COOKIE) : null;
      if (!secret) throw unauthorized('no dashboard session to end');
      await endSession(ctx.sql, secret, ctx.now());
      setCookie(reply, '', 0, secure());
      return reply.code(204).send(null);
    },
  );
}
