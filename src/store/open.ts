// Opens the configured store engine and brings its schema up to date.
import { join, resolve } from 'node:path';
import type { Config } from '../config/schema.js';
import { migrate } from './migrate.js';
import { openPglite } from './pglite.js';
import { openPostgres } from './postgres.js';
import type { Sql } from './sql.js';

export async function openStore(config: Pick<Config, 'databaseUrl' | 'dataDir'> & Partial<Pick<Config, 'embeddedSharedBuffersMb'>>): Promise<Sql> {
  const sql = config.databaseUrl
    ? await openPostgres(config.databaseUrl)
    : await openPglite(join(resolve(config.dataDir), 'pglite'), { sharedBuffersMb: config.embeddedSharedBuffersMb });
  try {
    await migrate(sql);
  } catch (err) {
    await sql.close().catch(() => {});
    throw err;
  }
  return sql;
}
