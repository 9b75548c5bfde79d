// Tests that run the real binary (bin/poolgate.js runs dist/) build dist/ first when a source is newer than its
// output: `npm test` has built it, a test file run on its own may not have.
import { existsSync, readdirSync, statSync, utimesSync } from 'node:fs';
import { join, relative } from 'node:path';
import { spawnSync } from 'node:child_process';
import { fromRoot } from '../../src/config/paths.js';

const ROOT = fromRoot();

/** The compiled files older than their source (or missing). */
function staleOutputs(): string[] {
  const stale: string[] = [];
  for (const e of readdirSync(join(ROOT, 'src'), { recursive: true, withFileTypes: true })) {
    if (!e.isFile() || !e.name.endsWith('.ts') || e.name.endsWith('.d.ts')) continue;
    const file = join(e.parentPath, e.name);
    const out = join(ROOT, 'dist', relative(ROOT, file)).replace(/\.ts$/, '.js');
    if (!existsSync(out) || statSync(out).mtimeMs < statSync(file).mtimeMs) stale.push(out);
  }
  return stale;
}

/** Builds dist/ if it is stale; returns tsc's complaints, if any (tsc emits even when a file fails to type-check). */
export function ensureBuiltDist(): string | null {
  const stale = staleOutputs();
  if (stale.length === 0) return null;
  // One build at a time across test processes.
  const build = spawnSync('flock', ['/tmp/poolgate-build.lock', 'npx', 'tsc', '-p', 'tsconfig.json'], { cwd: ROOT, encoding: 'utf8' });
  // The build is incremental: a source whose text did not change (touched, checked out again) is not emitted
  // again, so its output keeps its old time and would read as stale at every run. tsc has just vouched for it.
  const now = new Date();
  for (const out of stale) if (existsSync(out)) utimesSync(out, now, now);
  return build.status === 0 ? null : `${build.stdout}${build.stderr}`;
}
