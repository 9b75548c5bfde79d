// The secret fields of a stored credential as clients send them (inline attach and the one-shot intake),
// checked against the auth method; plus which methods fit which pool backend.
import { Type, type Static } from '@sinclair/typebox';
import type { AuthMethod } from './schemas.js';
import { SECRET_FIELDS, type CredentialSecret } from '../store/credentials.js';
import type { Queryable } from '../store/sql.js';

const Secret = Type.String({ minLength: 1, maxLength: 4000 });

/** Every secret property a client may send; which ones apply depends on the method. */
export const SecretFieldProps = {
  token: Type.Optional(Secret),
  api_key: Type.Optional(Secret),
  header_name: Type.Optional(Type.String({ minLength: 1, maxLength: 64 })),
  username: Type.Optional(Type.String({ minLength: 1, maxLength: 500 })),
  password: Type.Optional(Secret),
};
const SecretFieldsSchema = Type.Object(SecretFieldProps);
export type SecretFields = Static<typeof SecretFieldsSchema>;
export const SECRET_FIELD_NAMES = Object.keys(SecretFieldProps) as (keyof SecretFields)[];

/** The header an api_key credential is sent in when the caller names none. */
export const DEFAULT_API_KEY_HEADER = 'x-api-key';
const HEADER_TOKEN = /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/;
/** Headers the proxy owns; an api key sent in them would break framing or routing. */
const RESERVED_HEADERS = new Set(['host', 'content-length', 'transfer-encoding', 'connection', 'upgrade', 'te', 'trailer', 'keep-alive', 'proxy-authorization', 'x-service-key']);

/**
 * Fields a method may leave out: a database role without a password (the usual local MariaDB root, a trust-auth
 * PostgreSQL role) is attached with its username alone; docs/database-pools.md.
 */
const OPTIONAL_FIELDS: Partial<Record<AuthMethod, readonly string[]>> = { postgres_role: ['password'] };

/** Fields a handoff asks for: the method's secret fields (api_key also takes an optional header_name). */
export const requiredFields = (method: AuthMethod): string[] => [...SECRET_FIELDS[method]];

/** Fields a stored secret cannot do without: the method's fields less its optional ones. */
const neededFields = (method: AuthMethod): string[] => SECRET_FIELDS[method].filter((f) => !OPTIONAL_FIELDS[method]?.includes(f));

export function givenSecretFields(body: Partial<SecretFields>): (keyof SecretFields)[] {
  return SECRET_FIELD_NAMES.filter((f) => body[f] !== undefined);
}

export type SecretCheck = { ok: true; secret: CredentialSecret } | { ok: false; reason: string };

/** Builds the sealed-to-be secret for a method from the sent fields, or says exactly what is wrong. */
export function secretFor(method: AuthMethod, body: Partial<SecretFields>): SecretCheck {
  const given = givenSecretFields(body);
  const needed = neededFields(method);
  if (given.length === 0) return { ok: false, reason: `no secret fields: a ${method} credential needs ${needed.join(' and ')}` };
  const allowed = new Set<string>([...SECRET_FIELDS[method], ...(method === 'api_key' ? ['header_name'] : [])]);
  const stray = given.filter((f) => !allowed.has(f));
  if (stray.length) return { ok: false, reason: `${stray.join(', ')} ${stray.length > 1 ? 'are not fields' : 'is not a field'} of a ${method} credential (it takes ${[...allowed].join(', ')})` };
  const missing = needed.filter((f) => body[f as keyof SecretFields] === undefined);
  if (missing.length) return { ok: false, reason: `missing secret fields for ${method}: ${missing.join(', ')}` };
  // Secrets end up in request headers or connection parameters: line breaks and NULs would inject.
  for (const f of given) {
    if (/[\r\n\0]/.test(body[f]!)) return { ok: false, reason: `${f} must not contain line breaks or NUL characters` };
  }
  switch (method) {
    case 'bearer_static':
      return { ok: true, secret: { method, token: body.token! } };
    case 'api_key': {
      const header = (body.header_name ?? DEFAULT_API_KEY_HEADER).toLowerCase();
      if (!HEADER_TOKEN.test(header) || RESERVED_HEADERS.has(header)) return { ok: false, reason: `header_name ${JSON.stringify(body.header_name)} is not a usable header name` };
      return { ok: true, secret: { method, api_key: body.api_key!, header_name: header } };
    }
    case 'basic':
      if (body.username!.includes(':')) return { ok: false, reason: 'a basic username must not contain ":"' };
      return { ok: true, secret: { method, username: body.username!, password: body.password! } };
    case 'postgres_role':
      // No password: the role authenticates without one (trust, or an empty password); '' is what drivers send then.
      return { ok: true, secret: { method, username: body.username!, password: body.password ?? '' } };
  }
}

/** postgres_role is the database pools' method; the others are origin credentials of http pools. */
export function methodFitsBackend(method: AuthMethod, backend: 'http' | 'postgres' | 'mysql'): boolean {
  return method === 'postgres_role' ? backend !== 'http' : backend === 'http';
}

export function backendMismatch(method: AuthMethod, backend: 'http' | 'postgres' | 'mysql'): string {
  return method === 'postgres_role'
    ? 'method mismatch: postgres_role is only for database pools'
    : `method mismatch: ${method} is only for http pools; a ${backend} pool uses postgres_role`;
}

/** A free credential name in the team: the base, else "base (2)", "base (3)", … */
export async function freeCredentialName(db: Queryable, teamId: number, base: string): Promise<string> {
  let name = base;
  for (let n = 2; (await db.query('SELECT 1 FROM credentials WHERE team_id = $1 AND name = $2', [teamId, name])).rows.length > 0; n++) {
    name = `${base} (${n})`;
  }
  return name;
}
