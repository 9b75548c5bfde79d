// tap builds its Test class for the plugin list in package.json into node_modules/@tapjs/test. A fresh `npm ci`
// ships a class built with every default plugin, and tap rebuilds it only inside a run, after it has fixed the
// test processes' node arguments from the stale build (the first run of a fresh clone then loaded ts-node and the
// TypeScript compiler into every test process). The build is install work, once per install: `npm ci` runs it
// (scripts/prepare.mjs) and `npm test` checks again before it starts tap (scripts/test.mjs), for an install made
// with scripts turned off.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
/** tap's command-line entry (scripts/test.mjs runs tap through it). */
export const tapBin = join(root, 'node_modules', 'tap', 'dist', 'esm', 'run.mjs');

/** Whether the built Test class lists exactly the plugins the config asks for (tap's own comparison). */
async function tapBuildIsCurrent() {
  try {
    const { TapConfig } = await import('@tapjs/config');
    const { signature } = await import('@tapjs/test');
    const config = await TapConfig.load();
    return config.pluginSignature === signature;
  } catch {
    return false; // cannot tell: build (tap build is always safe)
  }
}

/** Runs `tap build` when the built plugin list differs from the configured one; false when the build failed. */
export async function ensureTapBuild() {
  if (!existsSync(tapBin)) return true; // a production install: no tap
  if (await tapBuildIsCurrent()) return true;
  console.error('tap: building the Test class for the configured plugins (once per install)');
  return spawnSync(process.execPath, [tapBin, 'build'], { cwd: root, stdio: 'inherit' }).status === 0;
}
