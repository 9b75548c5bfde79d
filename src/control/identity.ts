// GET /api/v1/me: the token's user, team and abilities (unwrapped; any valid token).
import { Type } from '@sinclair/typebox';
import { actorOf } from './auth.js';
import type { ControlContext, TypedApp } from './context.js';

export function identityRoutes(app: TypedApp, ctx: ControlContext): void {
  app.get(
    '/api/v1/me',
    {
      schema: {
        tags: ['identity'],
        summary: 'The token\'s user, team and abilities',
        response: { 200: Type.Ref('Me'), 401: Type.Ref('Error') },
      },
    },
    async (req) => {
      const actor = actorOf(req);
      const { rows } = await ctx.sql.query<{ uid: number; uname: string; email: string; tid: number; tname: string; slug: string }>(
        `SELECT u.id AS uid, u.name AS uname, u.email, t.id AS tid, t.name AS tname, t.slug
           FROM users u JOIN teams t ON t.id = u.team_id WHERE u.id = $1`,
        [actor.userId],
      );
      const r = rows[0]!;
      return {
        user: { id: r.uid, name: r.uname, email: r.email },
        team: { id: r.tid, name: r.tname, slug: r.slug },
        abilities: [...actor.abilities].sort(),
      };
    },
  );
}
