// Loads the snapshot (src/pool-request/snapshot.ts) from the store: pools by subdomain, live keys by hash,
// opened origin credentials and budgets. Loaded at start, reloaded on the change feed (coalesced) and by a periodic
// full resync (PostgreSQL; on the embedded store only after a failed load), so the hot path reads maps and never
// awaits the store.
import type { Logger } from '../log.js';
import type { SecretBox } from '../security/secret-box.js';
import { openCredential, type CredentialSecret } from '../store/credentials.js';
import { allowedMethods, resolvePoolSettings } from '../store/pool-settings.js';
import { CHANGE_CHANNEL, type Queryable, type Sql } from '../store/sql.js';
import type { PoolLimits } from '../governor/governor.js';
import { EMPTY_SNAPSHOT, type KeyChange, type KeyEntry, type PoolEntry, type Snapshot, type SnapshotFeed } from '../pool-request/snapshot.js';

interface PoolRow {
  id: number;
  subdomain: string;
  backend: 'http' | 'postgres' | 'mysql';
  status: 'active' | 'suspended';
  origin: string | null;
  max_concurrent: number;
  require_key: boolean;
  settings: unknown;
  credential_id: number | null;
  secret_enc: string | null;
  budget_id: number | null;
  reserved_concurrent: number | null;
  db_host: string | null;
  db_port: number | null;
  db_name: string | null;
  db_sslmode: 'verify-full' | 'require' | null;
  async_enabled: boolean;
  async_on_queue: boolean;
  has_destination: boolean;
}

interface KeyRow {
  id: number;
  pool_id: number;
  key_hash: string;
  access: 'read' | 'write';
  expires_at: Date | string | null;
  signing_secret_enc: string | null;
}

/** The pool_keys columns a KeyEntry is made from (the full load and the point update read the same). */
const KEY_COLUMNS = 'k.id, k.pool_id, k.key_hash, k.access, k.expires_at, k.signing_secret_enc';

/** One key's snapshot entry from its row. */
function keyEntry(row: KeyRow, box: SecretBox, log: Logger): KeyEntry {
  let signingSecret: string | null = null;
  if (row.signing_secret_enc) {
    try {
      signingSecret = box.open(row.signing_secret_enc);
    } catch (err) {
      // The key stays usable on pools that do not sign; signed requests with it are refused.
      log.error({ err, keyId: row.id }, 'cannot open the signing secret of a pool key');
    }
  }
  return {
    id: row.id,
    poolId: row.pool_id,
    access: row.access,
    expiresAt: row.expires_at === null ? null : new Date(row.expires_at).getTime(),
    signingSecret,
  };
}

/** Reads one consistent snapshot of everything the data plane needs. */
export async function loadSnapshot(db: Queryable, box: SecretBox, now: number, log: Logger): Promise<Snapshot> {
  await db.query('SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY');
  const pools = await db.query<PoolRow>(
    `SELECT p.id, p.subdomain, p.backend, p.status, p.origin, p.max_concurrent, p.require_key, p.settings,
            p.credential_id, c.secret_enc, bp.budget_id, bp.reserved_concurrent,
            p.db_host, p.db_port, p.db_name, p.db_sslmode,
            p.async_enabled, p.async_on_queue,
            EXISTS (SELECT 1 FROM pool_webhooks pw JOIN webhook_endpoints w ON w.id = pw.webhook_endpoint_id
                     WHERE pw.pool_id = p.id AND w.disabled = false) AS has_destination
       FROM pools p
       LEFT JOIN credentials c ON c.id = p.credential_id
       LEFT JOIN budget_pools bp ON bp.pool_id = p.id
      WHERE p.status <> 'deleted'`,
  );
  const keys = await db.query<KeyRow>(
    `SELECT ${KEY_COLUMNS}
       FROM pool_keys k JOIN pools p ON p.id = k.pool_id
      WHERE p.status <> 'deleted' AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > $1)`,
    [new Date(now)],
  );
  const budgets = await db.query<{ id: number; origin_max_concurrent: number | null }>('SELECT id, origin_max_concurrent FROM budgets');

  const poolMap = new Map<string, PoolEntry>();
  for (const row of pools.rows) {
    const settings = resolvePoolSettings(row.settings);
    let credential: CredentialSecret | null = null;
    if (row.secret_enc) {
      try {
        credential = openCredential(box, { secret_enc: row.secret_enc });
      } catch (err) {
        // A credential sealed under another master key must not take the whole snapshot down.
        log.error({ err, poolId: row.id, credentialId: row.credential_id }, 'cannot open the origin credential of a pool');
      }
    }
    let origin: string | null = null;
    let originHost: string | null = null;
    if (row.origin) {
      try {
        const u = new URL(row.origin);
        origin = u.origin;
        originHost = u.host;
      } catch {
        log.error({ poolId: row.id }, 'pool origin is not a URL; the pool cannot forward');
      }
    }
    const readPaths = new Map<string, readonly string[]>();
    for (const [method, prefixes] of Object.entries(settings.readPaths)) {
      if (prefixes.length > 0) readPaths.set(method, prefixes);
    }
    poolMap.set(row.subdomain.toLowerCase(), {
      id: row.id,
      subdomain: row.subdomain,
      backend: row.backend,
      status: row.status,
      origin,
      originHost,
      maxConcurrent: row.max_concurrent,
      requireKey: row.require_key,
      settings,
      readMethods: new Set(allowedMethods('read', settings)),
      readPaths,
      budgetId: row.budget_id,
      reservedConcurrent: row.reserved_concurrent ?? 0,
      credential,
      database:
        row.backend !== 'http' && row.db_host && row.db_name
          ? { host: row.db_host, port: row.db_port, name: row.db_name, sslmode: row.db_sslmode ?? 'verify-full' }
          : null,
      asyncEnabled: row.async_enabled,
      asyncOnQueue: row.async_on_queue,
      hasActiveDestination: row.has_destination,
    });
  }
  const keyMap = new Map<string, KeyEntry>();
  for (const row of keys.rows) keyMap.set(row.key_hash, keyEntry(row, box, log));
  return {
    pools: poolMap,
    keys: keyMap,
    budgets: budgets.rows.map((b) => ({ budgetId: b.id, originMaxConcurrent: b.origin_max_concurrent })),
    loadedAt: now,
    keyEdits: 0,
  };
}

/** The governor's view of a snapshot. */
export function poolLimits(snapshot: Snapshot): PoolLimits[] {
  const out: PoolLimits[] = [];
  for (const p of snapshot.pools.values()) {
    out.push({
      poolId: p.id,
      maxConcurrent: p.maxConcurrent,
      queueLength: p.settings.queueLength,
      queueTimeoutMs: p.settings.queueTimeoutMs,
      budgetId: p.budgetId,
      reservedConcurrent: p.reservedConcurrent,
      adaptive: p.settings.adaptive,
      adaptiveMin: p.settings.adaptiveMin,
      rpmOverride: p.settings.rpmOverride,
    });
  }
  return out;
}

interface KeyStateRow extends KeyRow {
  revoked_at: Date | string | null;
  pool_status: string;
}


/**
 * Applies `key:<id>` notifications to a snapshot's key map in place: each named key is read whatever its
 * state and is then present (live) or absent (revoked, expired, pool deleted, gone). One query per batch.
 * Returns what changed (worker threads apply the same changes to their copy).
 */
export async function applyKeyChanges(db: Queryable, keys: Map<string, KeyEntry>, ids: readonly number[], box: SecretBox, now: number, log: Logger): Promise<KeyChange[]> {
  const changes: KeyChange[] = [];
  const { rows } = await db.query<KeyStateRow>(
    `SELECT ${KEY_COLUMNS}, k.revoked_at, p.status AS pool_status
       FROM pool_keys k JOIN pools p ON p.id = k.pool_id
      WHERE k.id = ANY($1::int4[])`,
    [ids],
  );
  const seen = new Set<number>();
  for (const row of rows) {
    seen.add(row.id);
    const live = row.revoked_at === null && row.pool_status !== 'deleted' && (row.expires_at === null || new Date(row.expires_at).getTime() > now);
    if (live) {
      const entry = keyEntry(row, box, log);
      keys.set(row.key_hash, entry);
      changes.push([row.key_hash, entry]);
    } else if (keys.get(row.key_hash)?.id === row.id) {
      keys.delete(row.key_hash);
      changes.push([row.key_hash, null]);
    }
  }
  // A row that no longer exists: find its entry by id (rare, so a scan is fine).
  if (seen.size < ids.length) {
    const gone = new Set(ids.filter((id) => !seen.has(id)));
    for (const [hash, entry] of keys) {
      if (!gone.has(entry.id)) continue;
      keys.delete(hash);
      changes.push([hash, null]);
    }
  }
  return changes;
}

/** What a change notification asks of the data plane. */
type Change = { kind: 'key'; id: number } | { kind: 'none' } | { kind: 'full' };

/**
 * Kinds whose rows the snapshot does not hold: Control API tokens. Webhook destinations are not held
 * either, but whether a pool has an active one is (async admission), so `webhook:<id>` is a full reload.
 */
const NOT_IN_SNAPSHOT = new Set(['token']);

export function parseChange(payload: string): Change {
  const colon = payload.indexOf(':');
  const kind = colon < 0 ? payload : payload.slice(0, colon);
  const rest = colon < 0 ? '' : payload.slice(colon + 1);
  if (kind === 'key' && /^\d{1,9}$/.test(rest)) return { kind: 'key', id: Number(rest) };
  if (NOT_IN_SNAPSHOT.has(kind)) return { kind: 'none' };
  return { kind: 'full' };
}

export interface SnapshotSourceOptions {
  sql: Sql;
  box: SecretBox;
  log: Logger;
  clock: () => number;
  resyncMs: number;
  /** Called with each new snapshot (full loads), before the hot path sees it. */
  onLoad: (snapshot: Snapshot) => void;
  /** Called with each batch of key point updates, once applied to `current`. */
  onKeys?: (changes: readonly KeyChange[]) => void;
}


/**
 * Keeps `current` fresh. A `key:<id>` notification is a point update of that key; any other kind the
 * snapshot may hold (and the periodic resync) is a full reload. Work is coalesced: one load or update
 * runs at a time, and what arrives meanwhile is done once after it — all pending keys in one query, any
 * number of full requests as one reload. A failed load or update keeps the previous state; a failed
 * point update falls back to a full reload.
 */
export class SnapshotSource implements SnapshotFeed {
  current: Snapshot = EMPTY_SNAPSHOT;
  /** Full reloads done (start-up, resync, non-key notifications); for tests and diagnostics. */
  fullLoads = 0;
  /** Key point updates done (batches) and keys they applied. */
  keyUpdates = 0;
  keysApplied = 0;
  /** When the last full load was applied (Date.now ms; 0 before the first) and why the last one failed (null once one succeeds): for /readyz. */
  loadedAt = 0;
  lastLoadError: string | null = null;
  readonly #opts: SnapshotSourceOptions;
  #running: Promise<void> | null = null;
  #fullQueued = false;
  #pendingKeys = new Set<number>();
  #timer: NodeJS.Timeout | null = null;
  #unlisten: (() => Promise<void>) | null = null;
  #closed = false;

  constructor(opts: SnapshotSourceOptions) {
    this.#opts = opts;
  }

  /** Loads the first snapshot (a failure here fails start-up), then follows the change feed. */
  async start(): Promise<void> {
    await this.#loadOnce();
    this.#unlisten = await this.#opts.sql.listen(CHANGE_CHANNEL, (payload) => void this.#onChange(payload));
    this.#timer = setInterval(() => this.#resync(), this.#opts.resyncMs);
    this.#timer.unref();
  }

  /**
   * The periodic resync. It covers a notification the feed lost (a dropped LISTEN connection to PostgreSQL).
   * The embedded store delivers notifications in this process, after the commit that sent them, and cannot
   * lose one: there a full reload (~3 statements and the snapshot's objects, on the event loop that serves
   * pool traffic) is done only to retry one that failed.
   */
  #resync(): void {
    if (this.#opts.sql.engine === 'pglite' && this.lastLoadError === null) return;
    void this.reload();
  }

  #onChange(payload: string): Promise<void> {
    const change = parseChange(payload);
    if (change.kind === 'none') return Promise.resolve();
    if (change.kind === 'full') return this.reload();
    this.#pendingKeys.add(change.id);
    return this.#run();
  }

  /** Asks for a full reload; resolves when a load that started after this call has finished. */
  reload(): Promise<void> {
    this.#fullQueued = true;
    return this.#run();
  }

  /** Resolves when everything asked for so far is done. */
  #run(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    this.#running ??= (async () => {
      try {
        while (!this.#closed && (this.#fullQueued || this.#pendingKeys.size > 0)) {
          if (this.#fullQueued) {
            // A full load sees every key notified before it started (notifications follow commits).
            this.#fullQueued = false;
            this.#pendingKeys.clear();
            try {
              await this.#loadOnce();
            } catch (err) {
              this.lastLoadError = err instanceof Error ? err.message : String(err);
              this.#opts.log.error({ err }, 'data plane snapshot reload failed; keeping the previous snapshot');
            }
          } else {
            const ids = [...this.#pendingKeys];
            this.#pendingKeys.clear();
            try {
              await this.#applyKeys(ids);
            } catch (err) {
              this.#opts.log.error({ err }, 'data plane key update failed; reloading the whole snapshot');
              this.#fullQueued = true;
            }
          }
        }
      } finally {
        this.#running = null;
      }
    })();
    return this.#running;
  }

  async #applyKeys(ids: number[]): Promise<void> {
    const { sql, box, log, clock } = this.#opts;
    // The map belongs to the current snapshot; entries are replaced whole, never changed in place.
    const snapshot = this.current;
    const changes = await applyKeyChanges(sql, snapshot.keys as Map<string, KeyEntry>, ids, box, clock(), log);
    if (changes.length > 0) {
      snapshot.keyEdits++;
      this.#opts.onKeys?.(changes);
    }
    this.keyUpdates++;
    this.keysApplied += ids.length;
  }

  async #loadOnce(): Promise<void> {
    const { sql, box, log, clock } = this.#opts;
    const snapshot = await sql.transaction((tx) => loadSnapshot(tx, box, clock(), log));
    if (this.#closed) return;
    this.fullLoads++;
    this.#opts.onLoad(snapshot);
    this.current = snapshot;
    this.loadedAt = Date.now();
    this.lastLoadError = null;
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer) clearInterval(this.#timer);
    await this.#unlisten?.().catch(() => {});
    await this.#running?.catch(() => {});
  }
}
