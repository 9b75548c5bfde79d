// Embedded engine: PGlite in a data directory (the zero-install default). One connection, serialised.
import { mkdirSync } from 'node:fs';
import { PGlite } from '@electric-sql/pglite';
import type { QueryResult, Queryable, Sql, SqlParam } from './sql.js';

type PgliteQuery = (text: string, params?: unknown[]) => Promise<{ rows: unknown[]; affectedRows?: number }>;

function wrap(q: PgliteQuery): Queryable {
  return {
    async query<R>(text: string, params: readonly SqlParam[] = []): Promise<QueryResult<R>> {
      const res = await q(text, params as unknown[]);
      return { rows: res.rows as R[], rowCount: Math.max(res.rows.length, res.affectedRows ?? 0) };
    },
  };
}

export async function openPglite(dataDir: string | null): Promise<Sql> {
  if (dataDir) mkdirSync(dataDir, { recursive: true });
  const db = await PGlite.create(dataDir ?? undefined);
  const base = wrap((t, p) => db.query(t, p));
  return {
    engine: 'pglite',
    query: base.query,
    transaction: (fn) => db.transaction((tx) => fn(wrap((t, p) => tx.query(t, p)))),
    exec: async (script) => {
      await db.exec(script);
    },
    listen: async (channel, onPayload) => {
      const unsub = await db.listen(channel, onPayload);
      return async () => unsub();
    },
    notify: async (channel, payload) => {
      await db.query('SELECT pg_notify($1, $2)', [channel, payload]);
    },
    close: () => db.close(),
  };
}
