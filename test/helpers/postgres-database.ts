// A PostgreSQL database of a test's own on the shared server, apart from the service helpers so that a file that needs
// only a database (a topology of child processes, the rollup SQL) does not load the whole service (~0.8 s of CPU).
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { PG_URL } from './servers.js';

/** A fresh PostgreSQL database on the local server; dropped by the returned function. */
export async function freshPostgresDatabase(): Promise<{ url: string; drop(): Promise<void> }> {
  const name = `poolgate_t_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const url = new URL(PG_URL);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    async drop() {
      const c = new pg.Client({ connectionString: PG_URL });
      await c.connect();
      await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await c.end();
    },
  };
}
