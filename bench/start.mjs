// Start-up of `poolgate start` (every role, the embedded store already created): the CPU the process has used
// and the wall time from spawn until it prints its listening line, then SIGTERM. A restart's cost, not a
// first start's (that one runs initdb). Then the resident set: one first start (a new data directory) and one
// restart per build, each left idle BENCH_IDLE_S seconds (default 15) after its listening line, VmRSS and VmHWM
// (the peak) read from /proc (issue 29's target: idle RSS at most 250 MB).
//
//   npm run bench:start                                   this build
//   BENCH_BEFORE=/path/to/other/checkout npm run bench:start   the other build's bin/poolgate.js too, the two
//                                                          alternating round by round (before/after on one machine)
//   … -- --write-results                                 also rewrites the bench:start section of bench/RESULTS.md
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { root } from './lib/poolgate.mjs';
import { benchCommand, machine, writeJson, writeResults } from './lib/results.mjs';

const ROUNDS = Number(process.env.ROUNDS ?? 9);
/** The node flags of a checkout's `npm start`: each build runs with its own documented start command. */
const runtimeFlags = (dir) => JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')).scripts.start.split(' ').filter((a) => a.startsWith('--'));
const TICK_MS = 10; // /proc/<pid>/stat counts CPU in clock ticks of 10 ms

/** utime + stime of a running process, in ms. */
function cpuMs(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) * TICK_MS;
}

/** VmRSS and VmHWM (the peak resident set) of a running process, in MB. */
function residentMb(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (field) => Number(status.match(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm'))?.[1] ?? NaN);
  return { rssMb: Math.round(kb('VmRSS') / 1024), peakMb: Math.round(kb('VmHWM') / 1024) };
}

async function startOnce(bin, dataDir, idleMs = 0) {
  const env = {
    ...process.env,
    POOLGATE_HOST: '127.0.0.1',
    POOLGATE_CONTROL_PORT: '0', POOLGATE_PROXY_PORT: '0', POOLGATE_LOCK_PORT: '0',
    POOLGATE_METRICS_PORT: '0', POOLGATE_PG_PORT: '0', POOLGATE_MYSQL_PORT: '0',
    POOLGATE_DATA_DIR: dataDir, POOLGATE_LOG_LEVEL: 'warn',
    DATABASE_URL: '', REDIS_URL: '',
  };
  const t0 = performance.now();
  const child = spawn(process.execPath, [...runtimeFlags(join(dirname(bin), '..')), bin, 'start'], { env, stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const line = await new Promise((resolve, reject) => {
    createInterface({ input: child.stdout }).once('line', resolve);
    child.once('exit', (code) => reject(new Error(`${bin} exited (${code}) before listening`)));
  });
  const wallMs = performance.now() - t0;
  const cpu = cpuMs(child.pid);
  if (!line.includes('"listening"')) throw new Error(`unexpected first line: ${line}`);
  let memory;
  if (idleMs > 0) {
    await new Promise((resolve) => setTimeout(resolve, idleMs));
    memory = residentMb(child.pid);
  }
  child.kill('SIGTERM');
  await exited;
  return { cpuMs: cpu, wallMs, ...memory };
}

/** The checkout's commit, to name the build in the results. */
const commit = (dir) => {
  try {
    return execFileSync('git', ['-C', dir, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  } catch {
    return dir;
  }
};
const builds = [{ name: `this build (${commit(root)})`, bin: join(root, 'bin', 'poolgate.js') }];
if (process.env.BENCH_BEFORE) builds.unshift({ name: `before (${commit(process.env.BENCH_BEFORE)})`, bin: join(process.env.BENCH_BEFORE, 'bin', 'poolgate.js') });

const results = [];
for (const b of builds) {
  b.dataDir = mkdtempSync(join(tmpdir(), 'poolgate-bench-start-'));
  await startOnce(b.bin, b.dataDir); // the first start creates the store (initdb); not counted
  b.rounds = [];
}
for (let r = 0; r < ROUNDS; r++) {
  for (const b of builds) b.rounds.push(await startOnce(b.bin, b.dataDir));
}
const IDLE_MS = Number(process.env.BENCH_IDLE_S ?? 15) * 1000;
for (const b of builds) {
  const fresh = mkdtempSync(join(tmpdir(), 'poolgate-bench-start-'));
  b.firstStart = await startOnce(b.bin, fresh, IDLE_MS);
  b.restart = await startOnce(b.bin, fresh, IDLE_MS);
  rmSync(fresh, { recursive: true, force: true });
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
for (const b of builds) {
  rmSync(b.dataDir, { recursive: true, force: true });
  results.push({
    build: b.name, cpuMs: median(b.rounds.map((x) => x.cpuMs)), wallMs: Math.round(median(b.rounds.map((x) => x.wallMs))), rounds: b.rounds,
    firstStart: b.firstStart, restart: b.restart,
  });
}

const m = machine();
const rows = results.map((x) => `| ${x.build} | ${x.cpuMs} | ${x.wallMs} |`);
const ratio = results.length === 2 ? `\nAfter / before: CPU ${(results[1].cpuMs / results[0].cpuMs).toFixed(2)}, wall ${(results[1].wallMs / results[0].wallMs).toFixed(2)}.\n` : '';
writeResults('start', 'Start-up', `\`poolgate start\` with every role on an embedded store that exists (a restart), ${ROUNDS} rounds, builds alternating; medians.
CPU: what the process had used when it printed its listening line (/proc, 10 ms ticks); wall: from spawn to that line.

| build | CPU ms | wall ms |
|---|---:|---:|
${rows.join('\n')}
${ratio}
Resident set ${IDLE_MS / 1000} s after the listening line, idle (VmRSS), and the process's peak until then (VmHWM), in MB:

| build | first start: idle | first start: peak | restart: idle | restart: peak |
|---|---:|---:|---:|---:|
${results.map((x) => `| ${x.build} | ${x.firstStart.rssMb} | ${x.firstStart.peakMb} | ${x.restart.rssMb} | ${x.restart.peakMb} |`).join('\n')}
`, { command: benchCommand('npm run bench:start', ['ROUNDS']), m });
writeJson('start.json', { machine: m, rounds: ROUNDS, results });
console.log(results.map((x) => `${x.build}: cpu ${x.cpuMs} ms, wall ${x.wallMs} ms; RSS idle first start ${x.firstStart.rssMb} MB (peak ${x.firstStart.peakMb}), restart ${x.restart.rssMb} MB (peak ${x.restart.peakMb})`).join('\n'));
