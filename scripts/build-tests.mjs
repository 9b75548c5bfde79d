// Compiles the tests (test/**/*.ts) to dist/test/ with esbuild, one file per file, so that tap runs plain
// JavaScript: a test process then loads no TypeScript loader. tsx's module hooks cost ~0.5 s of CPU in each
// of the ~95 test processes, and the tests import the service from dist/src/ (`../src/x.js` from dist/test/),
// the code `npm start` runs. Like tsx, esbuild strips types and does not check them; the build takes ~0.2 s.
// The docs generators (scripts/gen-*.ts), which tests import, go to dist/scripts/ alongside.
//
// dist/test/ and dist/scripts/ are emptied first, so a file that was deleted or renamed does not linger there
// and run. test/fixtures/ is data that tests read, not code, and is not compiled.
import { build } from 'esbuild';
import { mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
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
  pointTapAtCurrentTest(entryPoints);
  writeGroups();
  return entryPoints.length;
}

// A test file's top-level `t` is `test/helpers/tap-current.ts`'s, so that a group can give each file a subtest
// of its own. Rewritten in the output, not in the sources: a file reads as an ordinary tap test.
function pointTapAtCurrentTest(entryPoints) {
  const shim = join(testOut, 'helpers', 'tap-current.js');
  for (const src of entryPoints) {
    if (!src.startsWith(testSrc + sep)) continue;
    const out = join(testOut, relative(testSrc, src).replace(/\.ts$/, '.js'));
    if (out === shim) continue;
    const js = readFileSync(out, 'utf8');
    if (!/from "tap";/.test(js)) continue;
    let rel = relative(dirname(out), shim).split(sep).join('/');
    if (!rel.startsWith('.')) rel = `./${rel}`;
    writeFileSync(out, js.replace(/from "tap";/g, `from ${JSON.stringify(rel)};`));
  }
}

// Test files that `npm test` runs several to a process (a group), and the files that keep a process of their own.
//
// A test process's fixed cost is most of a light file's CPU: tap's modules (~0.3 s), the service's modules
// (~0.6-0.8 s with the compile cache), the process itself. A group entry (dist/test/groups/N.test.js) imports
// its files one after another, each inside a subtest named by its path (`test/keys.test.ts`), so a failure
// names the file and the subtest, each file's teardowns run before the next file starts, and each file keeps
// tap's per-file timeout (the group's root gets the sum). `npm test -- test/x.test.ts` runs the file alone.
//
// A file stays alone when it touches what a process shares (process.exit, process.on, the environment, the
// working directory, undici's global dispatcher), sets its own timeout, or is long enough that a group with it
// would be the run's last process (OWN_PROCESS).
export const GROUP_SIZE = 4;
const OWN_PROCESS = new Set([
  // real processes or real volume, tens of seconds each (docs/testing.md, "CPU per test file")
  'dataplane-load', 'dataplane-threads', 'dataplane-threads-close', 'jobs', 'jobs-database', 'jobs-postgres',
  'jobs-crash', 'store', 'cli', 'cli-operator', 'readme-walkthrough', 'dashboard-browser', 'install-build',
  'governor-redis-nodes', 'redis-failover', 'lock-redis-nodes', 'lock-crash', 'node-loss', 'topology',
  'webhook-deliveries', 'webhook-crash', 'bad-input', 'admin-operator', 'adaptive-simulation', 'layers',
  'metrics.rollups', 'front-door-fuzz', 'front-door-abort-load',
]);
// Files that run alone, longest first (wall seconds in a fresh-clone CI run, 2026-11-28: cli 72, dataplane-load 62,
// jobs-crash 60, readme-walkthrough 54, store 51, cli-operator 46, dashboard-browser 45, topology 45, redis-failover
// 39, dataplane-threads 38, redis-cluster 35, dashboard-xss 33, jobs 33, webhook-deliveries 32).
const LONGEST_FIRST = [
  'cli', 'dataplane-load', 'jobs-crash', 'readme-walkthrough', 'store', 'cli-operator', 'dashboard-browser', 'topology',
  'redis-failover', 'dataplane-threads', 'redis-cluster', 'dashboard-xss', 'jobs', 'webhook-deliveries',
];
const PROCESS_WIDE = /process\.exit|process\.(on|once|chdir|umask)\(|process\.env(\.\w+|\[[^\]]+\])\s*=(?!=)|delete process\.env|setGlobalDispatcher|\bt\.setTimeout\(/;

/** Whether `test/<rel>` may share a process with other test files. */
function groupable(rel) {
  if (rel.includes(sep)) return false; // test/soak/, test/internals/: their own runs and setups
  if (OWN_PROCESS.has(rel.replace(/\.test\.ts$/, ''))) return false;
  return !PROCESS_WIDE.test(readFileSync(join(testSrc, rel), 'utf8'));
}

const groupsOut = join(testOut, 'groups');

function writeGroups() {
  const files = readdirSync(testSrc).filter((f) => f.endsWith('.test.ts')).sort();
  const grouped = files.filter(groupable);
  const groups = [];
  for (let i = 0; i < grouped.length; i += GROUP_SIZE) groups.push(grouped.slice(i, i + GROUP_SIZE));
  mkdirSync(groupsOut, { recursive: true });
  groups.forEach((g, i) => writeFileSync(join(groupsOut, `${String(i + 1).padStart(2, '0')}.test.js`), groupEntry(g)));
  // The longest files first, then the rest in the files' own order (a group where its first file was): tap starts
  // them in list order, six at a time, so a long file started late was the run's tail with one core idle (a CI run
  // with the files in name order: 6m42s wall for 9m25s of CPU, cli.test.ts ending last after 72 s).
  const list = files.flatMap((f) => {
    if (!grouped.includes(f)) return [relative(root, join(testOut, f.replace(/\.ts$/, '.js')))];
    const i = groups.findIndex((g) => g[0] === f);
    return i < 0 ? [] : [relative(root, join(groupsOut, `${String(i + 1).padStart(2, '0')}.test.js`))];
  });
  const rank = (path) => {
    const i = LONGEST_FIRST.indexOf(path.slice(path.lastIndexOf('/') + 1).replace(/\.test\.js$/, ''));
    return i < 0 ? LONGEST_FIRST.length : i;
  };
  const ordered = list.map((path, i) => ({ path, i })).sort((a, b) => rank(a.path) - rank(b.path) || a.i - b.i).map((e) => e.path);
  writeFileSync(join(groupsOut, 'list.json'), JSON.stringify([...ordered, ...internals()], null, 1));
}

/** test/internals/*.test.ts run as before, each in its own process. */
function internals() {
  return readdirSync(join(testSrc, 'internals')).filter((f) => f.endsWith('.test.ts')).sort()
    .map((f) => relative(root, join(testOut, 'internals', f.replace(/\.ts$/, '.js'))));
}

function groupEntry(files) {
  const lines = files.map((f) => `  [${JSON.stringify(`test/${f}`)}, ${JSON.stringify(`../${f.replace(/\.ts$/, '.js')}`)}],`);
  return `// Generated by scripts/build-tests.mjs: these test files, one after another, each in a subtest of its own.
import tap from 'tap';
import { setCurrentTest } from '../helpers/tap-current.js';

const files = [
${lines.join('\n')}
];
// tap's per-file timeout for each file, and their sum for the process (the runner's limit follows the root's).
const perFile = Number(process.env.TAP_TIMEOUT || 30) * 1000;
if (perFile > 0) tap.setTimeout(perFile * files.length);
for (const [name, path] of files) {
  await tap.test(name, { timeout: perFile }, async (t) => {
    setCurrentTest(t);
    await import(path);
  });
}
setCurrentTest(tap);
`;
}

/** The files `npm test` runs when none is named: the grouped entries and the files that run alone. */
export function defaultTestList() {
  return JSON.parse(readFileSync(join(groupsOut, 'list.json'), 'utf8'));
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
