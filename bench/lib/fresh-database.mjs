// A fresh PostgreSQL database on the local server for one bench run (the store of a poolgate under test),
// dropped again at the end.
import { randomBytes } from 'node:crypto';
import pg from 'pg';

/** Creates `poolgate_bench_<random>` through `adminUrl`; resolves to its URL and a drop() that removes it. */
export async function freshDatabase(adminUrl) {
  const name = `poolgate_bench_${randomBytes(5).toString('hex')}`;
  const run = async (sql) => {
    const c = new pg.Client({ connectionString: adminUrl });
    await c.connect();
    try {
      await c.query(sql);
    } finally {
      await c.end();
    }
  };
  await run(`CREATE DATABASE ${name}`);
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return { url: url.toString(), drop: () => run(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`) };
}
