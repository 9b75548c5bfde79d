// One migrated PGlite store per migration set, copied into each test's data dir. Creating and migrating
// a PGlite store costs ~4 s of CPU; copying a migrated one ~0.5 s, and the suite boots ~70 services.
//
// The template lives in node_modules/.cache/poolgate-test/pglite-<key>, where the key hashes the migration
// files (names and text), the code that creates and migrates the store (src/store/pglite.ts, migrate.ts)
// and the PGlite version: a changed migration gets a new template, and the stale
// ones are removed when it is built. tap runs each test file in its own process, so the first process to
// need it builds it under a lock file while the others wait; it is built in a temporary dir and renamed
// into place, so a reader never sees a half-built template.
//
// The template keeps only the database the store uses (`postgres`): PGlite's initdb also makes template0 and
// template1, ~600 of its ~1,100 files, which the store never opens. Creating those files again for every boot
// cost ~0.8 s of system time each (ext4), a copy of the pruned template ~40 ms.
import { createHash } from 'node:crypto';
import { closeSync, cpSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, rmSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fromRoot } from '../../src/config/paths.js';
import { openStore } from '../../src/store/open.js';

const CACHE = fromRoot('node_modules', '.cache', 'poolgate-test');
const MIGRATIONS = fromRoot('src', 'store', 'migrations');
/** A live builder that has not finished in this long is presumed stuck (its lock is taken over). */
const BUILD_WAIT_MS = 600_000;

/** Hash of everything the migrated store depends on. */
export function templateKey(): string {
  const h = createHash('sha256');
  h.update(`pruned to the postgres database\n`);
  h.update(`pglite ${JSON.parse(readFileSync(fromRoot('node_modules', '@electric-sql', 'pglite', 'package.json'), 'utf8')).version}\n`);
  for (const f of readdirSync(MIGRATIONS).filter((n) => n.endsWith('.sql')).sort()) {
    h.update(`${f}\n`).update(readFileSync(join(MIGRATIONS, f))).update('\n');
  }
  // The code that creates (initdb) and migrates the store.
  for (const f of ['pglite.ts', 'migrate.ts']) {
    const file = fromRoot('src', 'store', f);
    if (existsSync(file)) h.update(readFileSync(file)).update('\n');
  }
  return h.digest('hex').slice(0, 16);
}

let ready: Promise<string> | null = null;

/** The path of the migrated template store (a PGlite data dir), built on first use. */
export function pgliteTemplate(): Promise<string> {
  ready ??= ensureTemplate();
  return ready;
}

/** Puts a fresh copy of the migrated store in `dataDir` (as `dataDir/pglite`, where the service opens it). */
export async function seedPgliteDataDir(dataDir: string): Promise<void> {
  const template = await pgliteTemplate();
  cpSync(template, join(dataDir, 'pglite'), { recursive: true });
}

async function ensureTemplate(): Promise<string> {
  const key = templateKey();
  const dir = join(CACHE, `pglite-${key}`);
  if (existsSync(dir)) return dir;
  mkdirSync(CACHE, { recursive: true });
  const lock = `${dir}.lock`;
  const started = Date.now();
  for (;;) {
    if (existsSync(dir)) return dir;
    let fd: number;
    try {
      fd = openSync(lock, 'wx');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      // Another process is building it: wait, unless it died or is stuck.
      if (!builderAlive(lock) || Date.now() - started > BUILD_WAIT_MS) rmSync(lock, { force: true });
      else await sleep(100);
      continue;
    }
    try {
      writeSync(fd, String(process.pid));
      closeSync(fd);
      if (!existsSync(dir)) await build(dir, key);
      return dir;
    } finally {
      rmSync(lock, { force: true });
    }
  }
}

function builderAlive(lock: string): boolean {
  let pid: number;
  try {
    pid = Number(readFileSync(lock, 'utf8'));
  } catch {
    return true; // gone already, or just created and not yet written: look again
  }
  if (!pid) return true;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

async function build(dir: string, key: string): Promise<void> {
  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  try {
    // The service's own open path: PGlite in <dataDir>/pglite, migrated.
    const sql = await openStore({ databaseUrl: null, dataDir: tmp });
    for (const db of ['template0', 'template1']) {
      await sql.query(`ALTER DATABASE ${db} IS_TEMPLATE false`);
      await sql.query(`DROP DATABASE ${db}`);
    }
    await sql.query('CHECKPOINT');
    await sql.close();
    try {
      renameSync(join(tmp, 'pglite'), dir);
    } catch (err) {
      // Another builder (one that took over a stuck lock) got there first: its template is as good.
      if (!existsSync(dir)) throw err;
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  // Templates of other migration sets (and builds left by killed processes) are stale now.
  for (const name of readdirSync(CACHE)) {
    if (name.startsWith('pglite-') && !name.startsWith(`pglite-${key}`)) rmSync(join(CACHE, name), { recursive: true, force: true });
  }
}
