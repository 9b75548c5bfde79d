// Embedded engine: PGlite in a data directory (the zero-install default). One connection, serialised.
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { PGlite } from '@electric-sql/pglite';
import type { QueryResult, Queryable, Sql, SqlParam } from './sql.js';

type PgliteQuery = (text: string, params?: unknown[]) => Promise<{ rows: unknown[]; affectedRows?: number }>;

export interface PgliteOptions {
  /** shared_buffers in MB (default 32): PGlite's WebAssembly memory only grows, so this caps the buffer pool's share of RSS. */
  sharedBuffersMb?: number;
}

function wrap(q: PgliteQuery): Queryable {
  return {
    async query<R>(text: string, params: readonly SqlParam[] = []): Promise<QueryResult<R>> {
      const res = await q(text, params as unknown[]);
      return { rows: res.rows as R[], rowCount: Math.max(res.rows.length, res.affectedRows ?? 0) };
    },
  };
}

function startParams(opts: PgliteOptions): string[] {
  return [...PGlite.defaultStartParams, '-c', `shared_buffers=${opts.sharedBuffersMb ?? 32}MB`];
}

/**
 * initdb runs in a child process the first time: its WebAssembly instance touches ~500 MB, and only a process
 * that exits gives all of it back (in this thread it stayed resident for the life of the process; in a worker
 * thread, the freed isolate's memory still counted: 376 MB idle after a first start against 259 MB on restart).
 * The child runs its WebAssembly in Liftoff only, as the service does: TurboFan's tier-up of PostgreSQL's hot
 * functions doubled the child's peak (1,198 -> 586 MB) and cost more CPU than it saved (2.06 -> 1.40 s).
 */
async function initialiseInChild(dataDir: string, params: string[]): Promise<void> {
  const source = `
    const { module, dataDir, params } = JSON.parse(process.env.POOLGATE_PGLITE_INIT);
    const { PGlite } = await import(module);
    const db = await PGlite.create(dataDir, { startParams: params });
    await db.close();`;
  const init = JSON.stringify({ module: import.meta.resolve('@electric-sql/pglite'), dataDir, params });
  await new Promise<void>((resolve, reject) => {
    execFile(
      process.execPath,
      ['--liftoff-only', '--input-type=module', '-e', source],
      { env: { ...process.env, POOLGATE_PGLITE_INIT: init }, maxBuffer: 16 * 1024 * 1024 },
      (err, _stdout, stderr) => (err ? reject(new Error(`PGlite initialisation failed: ${stderr.trim() || err.message}`)) : resolve()),
    );
  });
}

export async function openPglite(dataDir: string | null, opts: PgliteOptions = {}): Promise<Sql> {
  const params = startParams(opts);
  if (dataDir) {
    mkdirSync(dataDir, { recursive: true });
    if (!existsSync(join(dataDir, 'PG_VERSION'))) await initialiseInChild(dataDir, params);
  }
  const db = await PGlite.create(dataDir ?? undefined, { startParams: params });
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
