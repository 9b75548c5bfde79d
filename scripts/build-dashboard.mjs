// Builds the dashboard's browser code (dashboard/*.ts and its CSS, uPlot included) into dist/dashboard
// with esbuild: two small bundles, no source served from node_modules, nothing fetched from elsewhere.
import { build } from 'esbuild';
import { mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

export async function buildDashboard(outdir = join(root, 'dist', 'dashboard')) {
  const { outputFiles } = await build({
    entryPoints: { app: join(root, 'dashboard', 'app.ts'), intake: join(root, 'dashboard', 'intake.ts') },
    outdir,
    bundle: true,
    format: 'esm',
    target: ['es2022'],
    minify: true,
    legalComments: 'none',
    logLevel: 'warning',
    write: false,
  });
  // Each file replaced whole by a rename: a running server (test files build it side by side) never reads a
  // half-written or missing asset.
  mkdirSync(outdir, { recursive: true });
  for (const f of outputFiles) {
    const tmp = `${f.path}.${process.pid}.tmp`;
    writeFileSync(tmp, f.contents);
    renameSync(tmp, f.path);
  }
  return outdir;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  await buildDashboard();
}
