// Embedded engine: PGlite in a data directory (the zero-install default). One connection, serialised.
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
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
 * initdb runs in a worker thread the first time: its WebAssembly instance (~500 MB touched) is freed with the
 * worker's isolate, where in this thread it stayed resident for the life of the process.
 */
async function initialiseInWorker(dataDir: string, params: string[]): Promise<void> {
  const source = `
    const { workerData, parentPort } = require('node:worker_threads');
    import(workerData.module)
      .then(async ({ PGlite }) => { const db = await PGlite.create(workerData.dataDir, { startParams: workerData.params }); await db.close(); })
      .then(() => parentPort.postMessage('ok'), (err) => parentPort.postMessage(String(err && err.stack || err)));`;
  const worker = new Worker(source, { eval: true, workerData: { module: import.meta.resolve('@electric-sql/pglite'), dataDir, params } });
  try {
    const outcome = await new Promise<unknown>((resolve, reject) => {
      worker.once('message', resolve);
      worker.once('error', reject);
      worker.once('exit', (code) => reject(new Error(`PGlite initialisation worker exited with code ${code}`)));
    });
    if (outcome !== 'ok') throw new Error(`PGlite initialisation failed: ${String(outcome)}`);
  } finally {
    await worker.terminate();
  }
}

export async function openPglite(dataDir: string | null, opts: PgliteOptions = {}): Promise<Sql> {
  const params = startParams(opts);
  if (dataDir) {
    mkdirSync(dataDir, { recursive: true });
    if (!existsSync(join(dataDir, 'PG_VERSION'))) await initialiseInWorker(dataDir, params);
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
