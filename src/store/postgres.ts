// Server engine: PostgreSQL through pg (built on pg-protocol), for many processes sharing one store.
import pg from 'pg';
import type { QueryResult, Queryable, Sql, SqlParam } from './sql.js';

function wrap(client: pg.Pool | pg.PoolClient): Queryable {
  return {
    async query<R>(text: string, params: readonly SqlParam[] = []): Promise<QueryResult<R>> {
      const res = await client.query(text, params as unknown[]);
      return { rows: res.rows as R[], rowCount: res.rowCount ?? res.rows.length };
    },
  };
}

export async function openPostgres(url: string, max = 10): Promise<Sql> {
  const pool = new pg.Pool({ connectionString: url, max, application_name: 'poolgate' });
  // An idle client dying (server restart) must not crash the process; the pool replaces it.
  pool.on('error', () => {});
  await pool.query('SELECT 1');
  const base = wrap(pool);
  const listeners = new Map<string, Set<(p: string) => void>>();
  let listenClient: pg.Client | null = null;

  async function listenConnection(): Promise<pg.Client> {
    if (listenClient) return listenClient;
    const c = new pg.Client({ connectionString: url, application_name: 'poolgate-listen' });
    c.on('error', () => {
      // Reconnect lazily and re-subscribe every channel; a missed notification is covered by the periodic resync.
      if (listenClient === c) listenClient = null;
      setTimeout(() => void resubscribe(), 1000).unref();
    });
    c.on('notification', (msg) => {
      for (const fn of listeners.get(msg.channel) ?? []) fn(msg.payload ?? '');
    });
    await c.connect();
    listenClient = c;
    return c;
  }
  async function resubscribe(): Promise<void> {
    if (listeners.size === 0) return;
    try {
      const c = await listenConnection();
      for (const ch of listeners.keys()) await c.query(`LISTEN "${ch.replaceAll('"', '""')}"`);
    } catch {
      setTimeout(() => void resubscribe(), 1000).unref();
    }
  }

  return {
    engine: 'postgres',
    query: base.query,
    async transaction(fn) {
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        const out = await fn(wrap(client));
        await client.query('COMMIT');
        return out;
      } catch (err) {
        await client.query('ROLLBACK').catch(() => {});
        throw err;
      } finally {
        client.release();
      }
    },
    exec: async (script) => {
      await pool.query(script);
    },
    async listen(channel, onPayload) {
      let set = listeners.get(channel);
      if (!set) {
        set = new Set();
        listeners.set(channel, set);
        const c = await listenConnection();
        await c.query(`LISTEN "${channel.replaceAll('"', '""')}"`);
      }
      set.add(onPayload);
      return async () => {
        set.delete(onPayload);
      };
    },
    notify: async (channel, payload) => {
      await pool.query('SELECT pg_notify($1, $2)', [channel, payload]);
    },
    async close() {
      const c = listenClient;
      listenClient = null;
      await c?.end().catch(() => {});
      await pool.end();
    },
  };
}
