// Opens the configured store engine and brings its schema up to date.
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { Config } from '../config/schema.js';
import { migrate } from './migrate.js';
import { openPglite } from './pglite.js';
import { openPostgres } from './postgres.js';
import type { Sql } from './sql.js';

type StoreConfig = Pick<Config, 'databaseUrl' | 'dataDir'> & Partial<Pick<Config, 'embeddedSharedBuffersMb'>>;

/** The store a command expected is not there: nothing was created, and the message says where it looked. */
export class StoreNotFoundError extends Error {
  override name = 'StoreNotFoundError';
}

/** Where the embedded store lives for this configuration. */
export function embeddedStoreDir(config: Pick<Config, 'dataDir'>): string {
  return join(resolve(config.dataDir), 'pglite');
}

export interface OpenStoreOptions {
  /**
   * false: open only a store that already exists (an admin command other than bootstrap); a missing one is refused
   * with StoreNotFoundError instead of being created empty where the command happened to run.
   */
  create?: boolean;
}

export async function openStore(config: StoreConfig, opts: OpenStoreOptions = {}): Promise<Sql> {
  const create = opts.create ?? true;
  if (!create && !config.databaseUrl && !existsSync(join(embeddedStoreDir(config), 'PG_VERSION'))) {
    throw new StoreNotFoundError(`no store at ${embeddedStoreDir(config)}`);
  }
  const sql = config.databaseUrl
    ? await openPostgres(config.databaseUrl)
    : await openPglite(embeddedStoreDir(config), { sharedBuffersMb: config.embeddedSharedBuffersMb });
  try {
    if (!create && sql.engine === 'postgres') {
      const { rows } = await sql.query<{ t: string | null }>(`SELECT to_regclass('schema_migrations')::text AS t`);
      if (!rows[0]?.t) throw new StoreNotFoundError('no poolgate store in the database at DATABASE_URL (it has no schema_migrations table)');
    }
    await migrate(sql);
  } catch (err) {
    await sql.close().catch(() => {});
    throw err;
  }
  return sql;
}
