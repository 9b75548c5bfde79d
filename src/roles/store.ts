// The store every role works on: the embedded one (PGlite in the data dir, held by this process through the
// data-dir lock) or PostgreSQL at DATABASE_URL, and the key that seals the secrets kept in it.
import { resolve } from 'node:path';
import type { Config } from '../config/schema.js';
import { loadMasterKey, SecretBox } from '../security/secret-box.js';
import { acquireDataDirLock } from '../store/data-dir-lock.js';
import { openStore } from '../store/open.js';
import type { Sql } from '../store/sql.js';
import type { Running } from './role.js';

export interface StoreRole extends Running {
  readonly sql: Sql;
  readonly box: SecretBox;
}

/** Opens the store; stop() closes it and frees the data dir for another process. */
export async function openServiceStore(config: Config): Promise<StoreRole> {
  const lock = config.databaseUrl ? null : acquireDataDirLock(resolve(config.dataDir));
  let sql: Sql | null = null;
  try {
    // The key first: a refused one (patterned, malformed) stops the start before the store is opened or created.
    const box = new SecretBox(loadMasterKey(config.secretKey, config.dataDir));
    sql = await openStore(config);
    const opened = sql;
    return {
      sql: opened,
      box,
      stop: async () => {
        await opened.close().catch(() => {});
        lock?.release();
      },
    };
  } catch (err) {
    await sql?.close().catch(() => {});
    lock?.release();
    throw err;
  }
}
