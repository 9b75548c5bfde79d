// Stored credential records: origin credentials, database roles and outbound webhook auth.
// The secret fields are sealed with the master key; only id, name and method are ever shown.
import type { SecretBox } from '../security/secret-box.js';
import type { AuthMethod } from '../domain/credential.js';
import type { Queryable } from './sql.js';

/** The secret fields each method needs (spec: auth_method values; `bearer_static` is also webhook auth). */
export const SECRET_FIELDS: Record<AuthMethod, readonly string[]> = {
  bearer_static: ['token'],
  api_key: ['api_key'],
  basic: ['username', 'password'],
  postgres_role: ['username', 'password'],
};

export type CredentialSecret =
  | { method: 'bearer_static'; token: string }
  | { method: 'api_key'; api_key: string; header_name: string }
  | { method: 'basic'; username: string; password: string }
  | { method: 'postgres_role'; username: string; password: string };

export interface CredentialRow {
  id: number;
  team_id: number;
  name: string;
  method: AuthMethod;
  secret_enc: string;
}

export async function createCredential(
  db: Queryable,
  box: SecretBox,
  teamId: number,
  name: string,
  secret: CredentialSecret,
): Promise<CredentialRow> {
  const { rows } = await db.query<CredentialRow>(
    `INSERT INTO credentials (team_id, name, method, secret_enc) VALUES ($1, $2, $3, $4)
     RETURNING id, team_id, name, method, secret_enc`,
    [teamId, name, secret.method, box.seal(JSON.stringify(secret))],
  );
  return rows[0]!;
}

/** A credential of the team by id or by name; another team's credential is not found. */
export async function findCredential(db: Queryable, teamId: number, ref: { id: number } | { name: string }): Promise<CredentialRow | null> {
  const { rows } = 'id' in ref
    ? await db.query<CredentialRow>('SELECT id, team_id, name, method, secret_enc FROM credentials WHERE team_id = $1 AND id = $2', [teamId, ref.id])
    : await db.query<CredentialRow>('SELECT id, team_id, name, method, secret_enc FROM credentials WHERE team_id = $1 AND name = $2', [teamId, ref.name]);
  return rows[0] ?? null;
}

export function openCredential(box: SecretBox, row: Pick<CredentialRow, 'secret_enc'>): CredentialSecret {
  return JSON.parse(box.open(row.secret_enc)) as CredentialSecret;
}
