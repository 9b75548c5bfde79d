// `npm install` / `npm ci` run this once (the `prepare` lifecycle script): compile to dist/ so that `npm start`
// and `npx poolgate` run without building, and build tap's Test class for the configured plugins
// (scripts/tap-build.mjs). Skipped where the sources are not there yet (the Dockerfile installs dependencies
// from package.json alone, then builds once the sources are copied) or with POOLGATE_SKIP_BUILD=1.
import { existsSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
if (process.env.POOLGATE_SKIP_BUILD === '1' || !existsSync(join(root, 'tsconfig.json')) || !existsSync(join(root, 'src'))) {
  process.stdout.write('poolgate: sources not present (or POOLGATE_SKIP_BUILD=1); not building\n');
  process.exit(0);
}
const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');
if (!existsSync(tsc)) {
  process.stdout.write('poolgate: typescript is not installed (production install); not building\n');
  process.exit(0);
}
// Build mode: nothing is compiled or written when dist/ is current. `npx poolgate` in the repository links the
// checkout into npx's cache and runs this script again (npm's exec), which otherwise rewrote dist/ in place
// while the service (or a test run) was loading it.
// The dashboard's project (type-checked, not emitted) too, as `npm run build` does: the first `npm test` then
// finds both current.
const projects = [join(root, 'tsconfig.json'), ...(existsSync(join(root, 'dashboard', 'tsconfig.json')) ? [join(root, 'dashboard')] : [])];
const r = spawnSync(process.execPath, [tsc, '-b', ...projects], { stdio: 'inherit' });
if (r.status !== 0) process.exit(r.status ?? 1);
// The dashboard's browser bundles (esbuild, a dev dependency like typescript).
const d = existsSync(join(root, 'dashboard')) ? spawnSync(process.execPath, [join(root, 'scripts', 'build-dashboard.mjs')], { stdio: 'inherit' }) : { status: 0 };
if (d.status !== 0) process.exit(d.status ?? 1);
// tap's Test class for the configured plugins (a development install: install work, not test work). A failure
// does not fail the install (`npm start` needs no tap): `npm test` checks again and stops there with tap's error.
const { ensureTapBuild } = await import('./tap-build.mjs');
if (!(await ensureTapBuild())) process.stdout.write('poolgate: tap build failed; `npm test` will try it again\n');
process.exit(0);
