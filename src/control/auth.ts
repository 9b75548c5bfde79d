// Bearer API token → the acting user, team and abilities. Tokens are looked up by SHA-256 hash.
import type { FastifyRequest } from 'fastify';
import { safeEqual, sha256Hex } from '../security/tokens.js';
import { findSession } from '../store/sessions.js';
import type { Queryable } from '../store/sql.js';
import { forbidden, unauthorized } from './errors.js';
import type { Ability } from './schemas.js';

export interface Actor {
  tokenId: number;
  teamId: number;
  userId: number;
  role: 'owner' | 'admin' | 'member';
  abilities: ReadonlySet<string>;
}

declare module 'fastify' {
  interface FastifyRequest {
    actor: Actor | null;
  }
}

const BEARER = /^Bearer[ \t]+([A-Za-z0-9_\-.~+/]+=*)[ \t]*$/i;

/**
 * Recently seen tokens, so a burst of Control API calls does not look the same token up every time.
 * An entry lives at most `ttlMs` and never past the token's own expiry; a `token:<id>` change on the
 * feed (revocation) clears the cache at once.
 */
export class ActorCache {
  readonly #entries = new Map<string, { actor: Actor; until: number }>();
  constructor(
    readonly ttlMs = 5_000,
    readonly maxEntries = 10_000,
  ) {}

  get(hash: string, nowMs: number): Actor | null {
    const e = this.#entries.get(hash);
    if (!e) return null;
    if (e.until <= nowMs) {
      this.#entries.delete(hash);
      return null;
    }
    return e.actor;
  }

  set(hash: string, actor: Actor, nowMs: number, tokenExpiresMs: number): void {
    if (this.#entries.size >= this.maxEntries) this.#entries.clear();
    this.#entries.set(hash, { actor, until: Math.min(nowMs + this.ttlMs, tokenExpiresMs) });
  }

  clear(): void {
    this.#entries.clear();
  }
}

export async function authenticate(sql: Queryable, header: string | undefined, now: Date, cache?: ActorCache): Promise<Actor> {
  const m = header ? BEARER.exec(header) : null;
  if (!m) throw unauthorized();
  const hash = sha256Hex(m[1]!);
  const nowMs = now.getTime();
  const cached = cache?.get(hash, nowMs);
  if (cached) return cached;
  const { rows } = await sql.query<{ id: number; team_id: number; user_id: number; role: Actor['role']; abilities: string[]; expires_at: Date }>(
    `SELECT t.id, t.team_id, t.user_id, u.role, t.abilities, t.expires_at
       FROM api_tokens t JOIN users u ON u.id = t.user_id
      WHERE t.token_hash = $1 AND t.revoked_at IS NULL AND t.expires_at > $2`,
    [hash, now],
  );
  const row = rows[0];
  if (!row) throw unauthorized();
  const actor: Actor = { tokenId: row.id, teamId: row.team_id, userId: row.user_id, role: row.role, abilities: new Set(row.abilities) };
  cache?.set(hash, actor, nowMs, new Date(row.expires_at).getTime());
  return actor;
}

/** The dashboard's session cookie: an opaque secret whose hash names a server-side session. */
export const SESSION_COOKIE = 'poolgate_session';
/** The header an unsafe (state-changing) request authenticated by the session cookie must carry. */
export const CSRF_HEADER = 'x-csrf-token';

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);

/** The value of one cookie in a Cookie header, or null; only our own cookie's alphabet is accepted. */
export function cookieValue(header: string | undefined, name: string): string | null {
  if (!header) return null;
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq < 0 || part.slice(0, eq).trim() !== name) continue;
    const v = part.slice(eq + 1).trim();
    return /^pgs_[A-Za-z0-9]{40}$/.test(v) ? v : null;
  }
  return null;
}

/**
 * The CSRF token of a session: derived from the cookie's secret, so only a page that was served to the
 * cookie's holder (same origin) knows it, and it needs no storage. A hash, so it reveals nothing of the secret.
 */
export function csrfTokenOf(sessionSecret: string): string {
  return sha256Hex(`poolgate-csrf:${sessionSecret}`);
}

/**
 * Who is calling: the bearer token when an Authorization header is sent (exactly as before: a bad one is
 * 401 and the cookie is not consulted), else the dashboard session cookie. A session may only change
 * state (any method but GET, HEAD, OPTIONS) with its CSRF token in the X-CSRF-Token header.
 */
export async function authenticateRequest(
  sql: Queryable,
  req: { method: string; headers: FastifyRequest['headers'] },
  now: Date,
  cache?: ActorCache,
): Promise<Actor> {
  const authorization = req.headers.authorization;
  if (authorization !== undefined) return authenticate(sql, authorization, now, cache);
  const cookie = typeof req.headers.cookie === 'string' ? req.headers.cookie : undefined;
  const secret = cookieValue(cookie, SESSION_COOKIE);
  if (!secret) throw unauthorized();
  const row = await findSession(sql, secret, now);
  if (!row) throw unauthorized();
  if (!SAFE_METHODS.has(req.method)) {
    const sent = req.headers[CSRF_HEADER];
    if (typeof sent !== 'string' || !safeEqual(sent, csrfTokenOf(secret))) {
      throw forbidden('a change made with the dashboard session needs its X-CSRF-Token header');
    }
  }
  return { tokenId: row.token_id ?? 0, teamId: row.team_id, userId: row.user_id, role: row.role, abilities: new Set(row.abilities) };
}

export function actorOf(req: FastifyRequest): Actor {
  if (!req.actor) throw unauthorized();
  return req.actor;
}

export function requireAbility(req: FastifyRequest, ability: Ability): Actor {
  const actor = actorOf(req);
  if (!actor.abilities.has(ability)) throw forbidden(`this token lacks the ${ability} ability`);
  return actor;
}

/** Webhook destinations are managed by owners and admins only (spec: Webhook destinations). */
export function requireManager(actor: Actor): void {
  if (actor.role !== 'owner' && actor.role !== 'admin') throw forbidden('only owners and admins may manage webhooks');
}
