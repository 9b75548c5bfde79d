// Teams, users and API tokens (what the spec puts in organization settings; operated by `poolgate admin`).
import { lastFour, newApiToken, sha256Hex } from '../security/tokens.js';
import type { Queryable } from './sql.js';

export const PLANS = ['free', 'pro', 'team', 'business'] as const;
export type Plan = (typeof PLANS)[number];
export const ROLES = ['owner', 'admin', 'member'] as const;
export type Role = (typeof ROLES)[number];
/** API token lifetimes the spec allows: 1 month, 6 months or 1 year. */
export const TOKEN_LIFETIMES = { '1m': 1, '6m': 6, '1y': 12 } as const;
export type TokenLifetime = keyof typeof TOKEN_LIFETIMES;

export interface TeamRow { id: number; name: string; slug: string; plan: Plan }
export interface UserRow { id: number; team_id: number; name: string; email: string; role: Role }

export function slugify(name: string): string {
  const s = name.toLowerCase().normalize('NFKD').replace(/[^a-z0-9]+/g, '-').replace(/^-+|-+$/g, '').slice(0, 40);
  return s || 'team';
}

export async function createTeam(db: Queryable, name: string, plan: Plan): Promise<TeamRow> {
  const base = slugify(name);
  for (let i = 0; ; i++) {
    const slug = i === 0 ? base : `${base}-${i + 1}`;
    const { rows } = await db.query<TeamRow>(
      `INSERT INTO teams (name, slug, plan) VALUES ($1, $2, $3) ON CONFLICT (slug) DO NOTHING RETURNING id, name, slug, plan`,
      [name, slug, plan],
    );
    if (rows[0]) return rows[0];
  }
}

/** Teams a reference names: an id, a slug, or a name (any case). A slug or id match wins over name matches. */
export async function findTeams(db: Queryable, ref: string): Promise<TeamRow[]> {
  const byId = /^\d{1,9}$/.test(ref);
  const { rows } = await db.query<TeamRow & { exact: boolean }>(
    // Slugs are made lower-case (slugify), so `--team Acme` finds slug acme as `--team acme` does.
    `SELECT id, name, slug, plan, ${byId ? 'id = $1::text::int' : 'slug = lower($1::text)'} AS exact FROM teams
     WHERE ${byId ? 'id = $1::text::int' : 'slug = lower($1::text)'} OR lower(name) = lower($1::text) ORDER BY 5 DESC, id`,
    [ref],
  );
  const exact = rows.filter((r) => r.exact);
  return (exact.length > 0 ? exact : rows).map(({ exact: _, ...team }) => team);
}

export async function findTeam(db: Queryable, ref: string): Promise<TeamRow | null> {
  return (await findTeams(db, ref))[0] ?? null;
}

export async function createUser(db: Queryable, teamId: number, name: string, email: string, role: Role): Promise<UserRow> {
  const { rows } = await db.query<UserRow>(
    `INSERT INTO users (team_id, name, email, role) VALUES ($1, $2, $3, $4) RETURNING id, team_id, name, email, role`,
    [teamId, name, email, role],
  );
  return rows[0]!;
}

export async function findUser(db: Queryable, teamId: number, ref: string): Promise<UserRow | null> {
  const byId = /^\d{1,9}$/.test(ref);
  const { rows } = await db.query<UserRow>(
    `SELECT id, team_id, name, email, role FROM users WHERE team_id = $1 AND ${byId ? 'id = $2::int' : 'lower(email) = lower($2)'}`,
    [teamId, ref],
  );
  return rows[0] ?? null;
}

export interface CreatedToken { id: number; token: string; name: string; abilities: string[]; expires_at: Date }

export async function createToken(
  db: Queryable,
  user: UserRow,
  opts: { name: string; abilities: readonly string[]; lifetime: TokenLifetime; now: Date },
): Promise<CreatedToken> {
  const token = newApiToken();
  const expires = new Date(opts.now);
  expires.setUTCMonth(expires.getUTCMonth() + TOKEN_LIFETIMES[opts.lifetime]);
  const { rows } = await db.query<{ id: number }>(
    `INSERT INTO api_tokens (team_id, user_id, name, token_hash, last_four, abilities, expires_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`,
    [user.team_id, user.id, opts.name, sha256Hex(token), lastFour(token), [...opts.abilities], expires],
  );
  return { id: rows[0]!.id, token, name: opts.name, abilities: [...opts.abilities], expires_at: expires };
}
