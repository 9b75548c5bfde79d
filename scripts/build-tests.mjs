// Compiles the tests (test/**/*.ts) to dist/test/ with esbuild, one file per file, so that tap runs plain
// JavaScript: a test process then loads no TypeScript loader. tsx's module hooks cost ~0.5 s of CPU in each
// of the ~95 test processes, and the tests import the service from dist/src/ (`../src/x.js` from dist/test/),
// the code `npm start` runs. Like tsx, esbuild strips types and does not check them; the build takes ~0.2 s.
// The docs generators (scripts/gen-*.ts), which tests import, go to dist/scripts/ alongside.
//
// dist/test/ and dist/scripts/ are emptied first, so a file that was deleted or renamed does not linger there
// and run. test/fixtures/ is data that tests read, not code, and is not compiled.
import { build } from 'esbuild';
import { readdirSync, rmSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const testSrc = join(root, 'test');
const testOut = join(root, 'dist', 'test');

/** The TypeScript files under `dir` (recursively), but none under a `fixtures` folder. */
function sources(dir) {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && e.name.endsWith('.ts') && !e.name.endsWith('.d.ts'))
    .map((e) => join(e.parentPath, e.name))
    .filter((f) => !relative(dir, f).split(sep).includes('fixtures'));
}

export async function buildTests() {
  const generators = sources(join(root, 'scripts')).filter((f) => /[\\/]gen-[^\\/]+\.ts$/.test(f));
  const entryPoints = [...sources(testSrc), ...generators];
  rmSync(testOut, { recursive: true, force: true });
  rmSync(join(root, 'dist', 'scripts'), { recursive: true, force: true });
  await build({
    entryPoints,
    outdir: join(root, 'dist'),
    outbase: root,
    format: 'esm',
    platform: 'node',
    target: 'node24',
    // Stack traces name the .ts file and line (tap runs tests with --enable-source-maps).
    sourcemap: 'linked',
    logLevel: 'warning',
  });
  return entryPoints.length;
}

/** `test/x.test.ts` (as typed, or from a shell glob) → `dist/test/x.test.js`; other arguments unchanged. */
export function compiledTestPath(arg) {
  if (arg.startsWith('-') || !arg.endsWith('.ts')) return arg;
  const rel = relative(testSrc, resolve(root, arg));
  if (rel.startsWith('..')) return arg;
  return relative(root, join(testOut, rel.replace(/\.ts$/, '.js')));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const n = await buildTests();
  console.log(`build-tests: ${n} files → dist/test/, dist/scripts/`);
}
