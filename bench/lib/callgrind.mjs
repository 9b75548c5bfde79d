// Reading callgrind's counters of a process running under `valgrind --tool=callgrind --instr-atstart=no`
// (bench/instructions.mjs, bench/db-instructions.mjs, bench/stalls.mjs).
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

/**
 * The callgrind command line a target runs under: collection off until the caller turns it on; dumps into `dir`.
 * fair: valgrind's ticket lock between the threads (`--fair-sched=yes`; valgrind runs one thread at a time, and its
 * default lock may let one thread run on while another waits): for a process with several data plane threads.
 */
export const callgrindWrap = (dir, fair = false) => ['valgrind', '--tool=callgrind', ...(fair ? ['--fair-sched=yes'] : []), '--instr-atstart=no', `--callgrind-out-file=${dir}/cg.%p`];

/**
 * The total Ir of the callgrind dump(s) written for `pid` (every thread) since the counters were last zeroed.
 * keep: a folder the dumps are copied to (callgrind_annotate names the native functions; JIT code is unnamed).
 * parts: names of native functions whose inclusive Ir is added to it by name (`parts.ir[name]`, callgrind_annotate).
 */
export function dumpIr(dir, pid, keep = null, parts = null) {
  const before = new Set(readdirSync(dir));
  execFileSync('callgrind_control', ['-d', String(pid)], { stdio: 'ignore' });
  const files = readdirSync(dir).filter((f) => f.startsWith(`cg.${pid}`) && !before.has(f));
  let ir = 0;
  for (const f of files) {
    const m = /^summary:\s+(\d+)/m.exec(readFileSync(join(dir, f), 'utf8'));
    if (m) ir += Number(m[1]);
  }
  if (ir === 0) throw new Error(`no callgrind dump for ${pid} in ${dir}`);
  if (keep) for (const f of files) execFileSync('cp', [join(dir, f), keep]);
  if (parts) {
    parts.ir = {};
    const text = execFileSync('callgrind_annotate', ['--inclusive=yes', '--threshold=100', ...files.map((f) => join(dir, f))], { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 });
    for (const name of parts.names) {
      // `  64,896,701 (69.25%)  ???:v8::internal::Heap::CollectGarbage(…) [/…/node]`; recursive cycles are listed as `name'2`.
      const line = text.split('\n').find((l) => l.includes(`:${name} [`) || l.includes(`:${name}(`));
      parts.ir[name] = line ? Number(line.trim().split(/\s+/)[0].replaceAll(',', '')) : 0;
    }
  }
  return ir;
}

/** Turns collection on or off (`-i`), or zeroes the counters (`-z`). */
export const callgrindControl = (pid, ...args) => execFileSync('callgrind_control', [...args, String(pid)], { stdio: 'ignore' });
