// Dashboard sessions and one-time sign-in links (tables dashboard_sessions, dashboard_login_links). The
// browser holds the session secret in an HttpOnly cookie; the store holds its SHA-256 only, as for tokens.
import { ABILITIES } from '../domain/abilities.js';
import { randomToken, sha256Hex } from '../security/tokens.js';
import type { Queryable, Sql } from './sql.js';

/** A session lasts at most this long (and never past the API token it was opened with). */
export const SESSION_TTL_MS = 12 * 3_600_000;
/** A sign-in link is short-lived: minted for someone about to click it. */
export const LOGIN_LINK_TTL_MS = 15 * 60_000;

export const newSessionSecret = (): string => `pgs_${randomToken(40)}`;
export const newLoginLink = (): string => `pgl_${randomToken(40)}`;

/** Abilities of a session opened with a sign-in link: the user's role decides (members read only). */
export function linkAbilities(role: string): string[] {
  return role === 'member' ? ['budgets:read', 'metrics:read', 'pools:read'] : [...ABILITIES];
}

export interface SessionActorRow {
  session_id: number;
  team_id: number;
  user_id: number;
  token_id: number | null;
  role: 'owner' | 'admin' | 'member';
  abilities: string[];
}

/** The live session behind a cookie secret, or null (unknown, ended, expired, or its token revoked or expired). */
export async function findSession(db: Queryable, secret: string, now: Date): Promise<SessionActorRow | null> {
  const { rows } = await db.query<SessionActorRow>(
    `SELECT s.id AS session_id, s.team_id, s.user_id, s.token_id, u.role, s.abilities
       FROM dashboard_sessions s JOIN users u ON u.id = s.user_id
       LEFT JOIN api_tokens t ON t.id = s.token_id
      WHERE s.session_hash = $1 AND s.ended_at IS NULL AND s.expires_at > $2
        AND (s.token_id IS NULL OR (t.revoked_at IS NULL AND t.expires_at > $2))`,
    [sha256Hex(secret), now],
  );
  return rows[0] ?? null;
}

export interface OpenedSession {
  secret: string;
  expiresAt: Date;
  teamId: number;
  userId: number;
  abilities: string[];
}

async function insertSession(db: Queryable, s: { teamId: number; userId: number; tokenId: number | null; abilities: string[]; expiresAt: Date; now: Date }): Promise<OpenedSession> {
  const secret = newSessionSecret();
  await db.query(
    `INSERT INTO dashboard_sessions (session_hash, team_id, user_id, token_id, abilities, expires_at, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7)`,
    [sha256Hex(secret), s.teamId, s.userId, s.tokenId, s.abilities, s.expiresAt, s.now],
  );
  return { secret, expiresAt: s.expiresAt, teamId: s.teamId, userId: s.userId, abilities: [...s.abilities].sort() };
}

/** Opens a session for a live API token (its abilities, ending no later than it does); null for a bad token. */
export async function sessionFromToken(db: Queryable, token: string, now: Date): Promise<OpenedSession | null> {
  const { rows } = await db.query<{ id: number; team_id: number; user_id: number; abilities: string[]; expires_at: Date }>(
    `SELECT id, team_id, user_id, abilities, expires_at FROM api_tokens
      WHERE token_hash = $1 AND revoked_at IS NULL AND expires_at > $2`,
    [sha256Hex(token), now],
  );
  const t = rows[0];
  if (!t) return null;
  const expiresAt = new Date(Math.min(now.getTime() + SESSION_TTL_MS, new Date(t.expires_at).getTime()));
  return insertSession(db, { teamId: t.team_id, userId: t.user_id, tokenId: t.id, abilities: t.abilities, expiresAt, now });
}

/**
 * Spends a sign-in link and opens a session for its user. The link is marked used in the same transaction
 * (FOR UPDATE), so two clicks cannot both sign in. Returns why not otherwise.
 */
export async function sessionFromLink(sql: Sql, link: string, now: Date): Promise<OpenedSession | 'unknown' | 'used' | 'expired'> {
  return sql.transaction(async (tx) => {
    const { rows } = await tx.query<{ id: number; team_id: number; user_id: number; role: string; expires_at: Date; used_at: Date | null }>(
      `SELECT l.id, l.team_id, l.user_id, u.role, l.expires_at, l.used_at
         FROM dashboard_login_links l JOIN users u ON u.id = l.user_id
        WHERE l.link_hash = $1 FOR UPDATE OF l`,
      [sha256Hex(link)],
    );
    const l = rows[0];
    if (!l) return 'unknown' as const;
    if (l.used_at) return 'used' as const;
    if (new Date(l.expires_at).getTime() <= now.getTime()) return 'expired' as const;
    await tx.query('UPDATE dashboard_login_links SET used_at = $2 WHERE id = $1', [l.id, now]);
    return insertSession(tx, {
      teamId: l.team_id, userId: l.user_id, tokenId: null, abilities: linkAbilities(l.role),
      expiresAt: new Date(now.getTime() + SESSION_TTL_MS), now,
    });
  });
}

/** Ends the session behind a cookie secret (sign-out); true when one was live. */
export async function endSession(db: Queryable, secret: string, now: Date): Promise<boolean> {
  const { rowCount } = await db.query('UPDATE dashboard_sessions SET ended_at = $2 WHERE session_hash = $1 AND ended_at IS NULL', [sha256Hex(secret), now]);
  return rowCount > 0;
}

/** Mints a one-time sign-in link for a user; only its hash is stored. */
export async function createLoginLink(db: Queryable, teamId: number, userId: number, now: Date): Promise<{ link: string; expiresAt: Date }> {
  const link = newLoginLink();
  const expiresAt = new Date(now.getTime() + LOGIN_LINK_TTL_MS);
  await db.query(
    'INSERT INTO dashboard_login_links (link_hash, team_id, user_id, expires_at, created_at) VALUES ($1, $2, $3, $4, $5)',
    [sha256Hex(link), teamId, userId, expiresAt, now],
  );
  return { link, expiresAt };
}
