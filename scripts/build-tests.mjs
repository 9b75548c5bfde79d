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
// Files that run alone, longest first (wall seconds in a fresh-clone `npm test`, 6 at a time, 2026-11-28 evening:
// dataplane-load 36, dataplane-threads 25, dashboard-browser 25, redis-cluster 23, cli 23, readme-walkthrough 22,
// dataplane-threads-close 19, store 19, lock-redis-nodes 19, webhook-crash 19, jobs-crash 18, cli-operator 17,
// jobs 16, redis-failover 16, topology 15, front-door-fuzz 14, front-door-abort-load 14, front-door-conformance 14,
// dashboard-xss 13, front-door-second-round 13, dashboard-operator 12, jobs-database 12, node-loss 12;
// then files of 13-20 s that had ended the run when started after the groups).
const LONGEST_FIRST = [
  'dataplane-load', 'dataplane-threads', 'dashboard-browser', 'redis-cluster', 'cli', 'readme-walkthrough',
  'dataplane-threads-close', 'store', 'lock-redis-nodes', 'webhook-crash', 'jobs-crash', 'cli-operator', 'jobs',
  'redis-failover', 'topology', 'front-door-fuzz', 'front-door-abort-load', 'front-door-conformance', 'dashboard-xss',
  'front-door-second-round', 'dashboard-operator', 'jobs-database', 'node-loss', 'governor-redis-nodes',
  'webhook-deliveries', 'jobs-postgres', 'lock-crash', 'metrics.rollups', 'pool-limit-why',
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
  // The longest files first, then the groups, then the rest: tap starts them in list order, six at a time, and a
  // long file started late is the run's tail with one core idle.
  const list = files.flatMap((f) => {
    if (!grouped.includes(f)) return [relative(root, join(testOut, f.replace(/\.ts$/, '.js')))];
    const i = groups.findIndex((g) => g[0] === f);
    return i < 0 ? [] : [relative(root, join(groupsOut, `${String(i + 1).padStart(2, '0')}.test.js`))];
  });
  const rank = (path) => {
    const i = LONGEST_FIRST.indexOf(path.slice(path.lastIndexOf('/') + 1).replace(/\.test\.js$/, ''));
    if (i >= 0) return i;
    return path.includes('/groups/') ? LONGEST_FIRST.length : LONGEST_FIRST.length + 1;
  };
  const ordered = list.map((path, i) => ({ path, i })).sort((a, b) => rank(a.path) - rank(b.path) || a.i - b.i).map((e) => e.path);
  writeFileSync(join(groupsOut, 'list.json'), JSON.stringify(numbered([...ordered, ...internals()]), null, 1));
}

const runOut = join(testOut, 'run');

/**
 * The order lives in the names: tap sorts the files it is given by name (@tapjs/run's list.js, localeCompare) and
 * starts them in that order, so a list in any other order ran alphabetically (a fresh-clone run started store,
 * readme-walkthrough and redis-cluster ~135 s into a 160 s run). Each file gets an entry `run/NNN-<name>` that
 * imports it (its own module, its own import.meta.url); `npm test -- test/x.test.ts` still runs the file itself.
 */
function numbered(paths) {
  mkdirSync(runOut, { recursive: true });
  return paths.map((path, i) => {
    const target = join(root, path);
    const name = `${String(i + 1).padStart(3, '0')}-${relative(testOut, target).split(sep).join('-')}`;
    const entry = join(runOut, name);
    const rel = relative(runOut, target).split(sep).join('/');
    writeFileSync(entry, `// Generated by scripts/build-tests.mjs: runs ${relative(root, target)} at its place in the order.\nimport ${JSON.stringify(rel.startsWith('.') ? rel : `./${rel}`)};\n`);
    return relative(root, entry);
  });
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
