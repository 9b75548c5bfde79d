// Applies src/store/migrations/*.sql in name order, each once, each in its own transaction.
import { readdirSync, readFileSync } from 'node:fs';
import { fromRoot } from '../config/paths.js';
import type { Sql } from './sql.js';

const MIGRATIONS_DIR = fromRoot('src', 'store', 'migrations');
// Serialises migrating processes on a shared PostgreSQL (roles started together).
const MIGRATION_LOCK = 74_210_117;

export async function migrate(sql: Sql): Promise<string[]> {
  // Under the lock too: concurrent CREATE TABLE IF NOT EXISTS on a fresh database races in PostgreSQL's catalog.
  await sql.transaction(async (tx) => {
    if (sql.engine === 'postgres') await tx.query('SELECT pg_advisory_xact_lock($1)', [MIGRATION_LOCK]);
    await tx.query('CREATE TABLE IF NOT EXISTS schema_migrations (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())');
  });
  const files = readdirSync(MIGRATIONS_DIR).filter((f) => f.endsWith('.sql')).sort();
  const applied: string[] = [];
  for (const file of files) {
    const version = file.replace(/\.sql$/, '');
    const script = readFileSync(`${MIGRATIONS_DIR}/${file}`, 'utf8');
    const did = await sql.transaction(async (tx) => {
      if (sql.engine === 'postgres') await tx.query('SELECT pg_advisory_xact_lock($1)', [MIGRATION_LOCK]);
      const seen = await tx.query('SELECT 1 FROM schema_migrations WHERE version = $1', [version]);
      if (seen.rowCount > 0) return false;
      // Statements run one by one so the same code path serves both engines inside a transaction.
      for (const stmt of splitStatements(script)) await tx.query(stmt);
      await tx.query('INSERT INTO schema_migrations (version) VALUES ($1)', [version]);
      return true;
    });
    if (did) applied.push(version);
  }
  return applied;
}

/** Splits a migration on top-level semicolons (our migrations use no dollar-quoted bodies with ';'). */
export function splitStatements(script: string): string[] {
  return script
    .split('\n')
    .filter((line) => !line.trim().startsWith('--'))
    .join('\n')
    .split(/;\s*(?:\n|$)/)
    .map((s) => s.trim())
    .filter(Boolean);
}
