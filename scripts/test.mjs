#!/usr/bin/env node
// Runs tap (`npm test`, `npm run test:soak`) and prints the run's wall time and CPU time at the end.
//
// The tests run compiled: dist/test/ is built from test/ first (scripts/build-tests.mjs), and arguments naming
// test files (`npm test -- test/keys.test.ts`) are mapped to their compiled paths. dist/src/ is the `pretest`
// build's.
//
// First it makes sure tap's Test class is built with the plugin list in package.json (scripts/tap-build.mjs:
// `npm ci` has normally done it).
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { buildTests, compiledTestPath, defaultTestList } from './build-tests.mjs';
import { makeScratch, removeScratch } from './test-scratch.mjs';
import { ensureTapBuild, tapBin } from './tap-build.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
// Keeps tap's processinfo from re-reading every module each test process loads (see the file).
const runnerPreload = join(root, 'scripts', 'tap-runner-preload.mjs');

function fmt(ms) {
  const s = Math.round(ms / 1000);
  return s >= 60 ? `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s` : `${s}s`;
}

/** CPU seconds of this process's finished children (Linux: /proc/self/stat cutime + cstime). */
function childrenCpuMs() {
  try {
    const stat = readFileSync('/proc/self/stat', 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // fields[0] is field 3 (state); cutime and cstime are fields 16 and 17, in clock ticks (100 per second).
    return ((Number(fields[13]) + Number(fields[14])) * 1000) / 100;
  } catch {
    return null;
  }
}

const started = performance.now();
try {
  await buildTests();
} catch {
  // esbuild has printed what does not compile.
  console.error('tests: test/ does not compile (see above)');
  process.exit(1);
}
// The store template for this checkout (test/helpers/warm-up.ts), built side by side with the first test
// processes' start: they load their modules meanwhile (~1 s of CPU each) and the first one to need the template
// waits on its lock. A failed warm-up is not fatal: the test processes build the template themselves (and report
// what fails).
spawn(process.execPath, ['--liftoff-only', join(root, 'dist', 'test', 'helpers', 'warm-up.js')], { cwd: root, stdio: 'inherit' });
if (!(await ensureTapBuild())) process.exit(1);
// The test processes' TMPDIR: in memory where the machine has a tmpfs (scripts/test-scratch.mjs).
const scratch = makeScratch();
const env = { ...process.env, ...(scratch ? { TMPDIR: scratch } : {}) };
// The `poolgate` processes tests spawn open their embedded stores with an 8 MB buffer pool, as in-process test
// services do (test/helpers/service.ts): PGlite zeroes its shared memory at every open. A test that wants the
// service's default sets its own environment.
env.POOLGATE_EMBEDDED_SHARED_BUFFERS_MB ??= '8';
// V8's compiled code for every module, kept on disk across processes and runs (Node's module compile cache): each
// test process, worker thread and child loads ~670 modules (the service, TypeBox, tap), and compiling them again
// was ~0.25 s of CPU per test process (2026-11-28). A changed file misses (the cache checks each file's content);
// a different Node or V8 flag set gets a directory of its own. It changes what runs in no way.
env.NODE_COMPILE_CACHE ??= join(root, 'node_modules', '.cache', 'poolgate-test', 'compile-cache');
// With no file named, tap runs the default list: light files several to a process (scripts/build-tests.mjs).
const args = process.argv.slice(2).map(compiledTestPath);
if (!args.some((a) => !a.startsWith('-'))) args.push(...defaultTestList());
const child = spawn(process.execPath, ['--import', pathToFileURL(runnerPreload).href, tapBin, ...args], { cwd: root, stdio: 'inherit', env });
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => child.kill(sig));
child.on('exit', (code, signal) => {
  removeScratch(scratch);
  const cpu = childrenCpuMs();
  const name = process.env.npm_lifecycle_event ? `npm ${process.env.npm_lifecycle_event === 'test' ? 'test' : `run ${process.env.npm_lifecycle_event}`}` : 'tests';
  console.log(`# ${name}: ${fmt(performance.now() - started)} wall${cpu === null ? '' : `, ${fmt(cpu)} CPU`}`);
  process.exit(code ?? (signal ? 1 : 0));
});
