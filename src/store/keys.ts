// Pool key rows: minted keys are stored as SHA-256 hashes (plaintext never stored), revoked in place.
import type { Queryable } from './sql.js';

export type KeyAccess = 'read' | 'write';

export interface PoolKeyRow {
  id: number;
  pool_id: number;
  label: string;
  key_hash: string;
  last_four: string;
  access: KeyAccess;
  signing_secret_enc: string | null;
  expires_at: Date | null;
  revoked_at: Date | null;
  created_at: Date;
}

/** What the data plane keeps of a key in its snapshot: enough to authenticate, scope and sign. */
export interface SnapshotKeyRow {
  id: number;
  pool_id: number;
  key_hash: string;
  access: KeyAccess;
  signing_secret_enc: string | null;
  expires_at: Date | null;
  revoked_at: Date | null;
}

const KEY_COLUMNS = 'id, pool_id, label, key_hash, last_four, access, signing_secret_enc, expires_at, revoked_at, created_at';
const SNAPSHOT_COLUMNS = 'k.id, k.pool_id, k.key_hash, k.access, k.signing_secret_enc, k.expires_at, k.revoked_at';

export async function insertKey(
  db: Queryable,
  key: { poolId: number; label: string; keyHash: string; lastFour: string; access: KeyAccess; signingSecretEnc: string | null; expiresAt: Date | null; now: Date },
): Promise<PoolKeyRow> {
  const { rows } = await db.query<PoolKeyRow>(
    `INSERT INTO pool_keys (pool_id, label, key_hash, last_four, access, signing_secret_enc, expires_at, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING ${KEY_COLUMNS}`,
    [key.poolId, key.label, key.keyHash, key.lastFour, key.access, key.signingSecretEnc, key.expiresAt, key.now],
  );
  return rows[0]!;
}

/** A key of the given pool by id; a key of another pool is not found. */
export async function findKey(db: Queryable, poolId: number, id: number): Promise<PoolKeyRow | null> {
  const { rows } = await db.query<PoolKeyRow>(`SELECT ${KEY_COLUMNS} FROM pool_keys WHERE pool_id = $1 AND id = $2`, [poolId, id]);
  return rows[0] ?? null;
}

/** Every key of the pool, revoked and expired ones too, newest first (the list view; never the key itself). */
export async function listPoolKeys(db: Queryable, poolId: number): Promise<PoolKeyRow[]> {
  const { rows } = await db.query<PoolKeyRow>(`SELECT ${KEY_COLUMNS} FROM pool_keys WHERE pool_id = $1 ORDER BY id DESC`, [poolId]);
  return rows;
}

/**
 * Revokes a key of the pool. Idempotent: a key already revoked keeps its first revoked_at.
 * Returns the key (revoked) and whether this call changed it, or null when the pool has no such key.
 */
export async function revokeKey(db: Queryable, poolId: number, id: number, now: Date): Promise<{ key: PoolKeyRow; changed: boolean } | null> {
  const { rows } = await db.query<PoolKeyRow>(
    `UPDATE pool_keys SET revoked_at = $3 WHERE pool_id = $1 AND id = $2 AND revoked_at IS NULL RETURNING ${KEY_COLUMNS}`,
    [poolId, id, now],
  );
  if (rows[0]) return { key: rows[0], changed: true };
  const existing = await findKey(db, poolId, id);
  return existing ? { key: existing, changed: false } : null;
}

/**
 * Every key that can still admit traffic at `now`, across all live pools: the data plane's snapshot load.
 * Keys that expire later are included with their expires_at; the data plane checks it per request.
 */
export async function listLiveKeys(db: Queryable, now: Date): Promise<SnapshotKeyRow[]> {
  const { rows } = await db.query<SnapshotKeyRow>(
    `SELECT ${SNAPSHOT_COLUMNS}
       FROM pool_keys k JOIN pools p ON p.id = k.pool_id
      WHERE p.status <> 'deleted' AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > $1)
      ORDER BY k.id`,
    [now],
  );
  return rows;
}

/**
 * One key by id whatever its state, for a `key:<id>` change notification: the data plane replaces or
 * drops its entry (revoked, expired, or gone with its pool → null or revoked_at set).
 */
export async function findSnapshotKey(db: Queryable, id: number): Promise<SnapshotKeyRow | null> {
  const { rows } = await db.query<SnapshotKeyRow>(
    `SELECT ${SNAPSHOT_COLUMNS} FROM pool_keys k JOIN pools p ON p.id = k.pool_id WHERE k.id = $1 AND p.status <> 'deleted'`,
    [id],
  );
  return rows[0] ?? null;
}
