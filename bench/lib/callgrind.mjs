// Reading callgrind's counters of a process running under `valgrind --tool=callgrind --instr-atstart=no`
// (bench/instructions.mjs, bench/db-instructions.mjs).
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

/** The callgrind command line a target runs under: collection off until the caller turns it on; dumps into `dir`. */
export const callgrindWrap = (dir) => ['valgrind', '--tool=callgrind', '--instr-atstart=no', `--callgrind-out-file=${dir}/cg.%p`];

/**
 * The total Ir of the callgrind dump(s) written for `pid` (every thread) since the counters were last zeroed.
 * keep: a folder the dumps are copied to (callgrind_annotate names the native functions; JIT code is unnamed).
 */
export function dumpIr(dir, pid, keep = null) {
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
  return ir;
}

/** Turns collection on or off (`-i`), or zeroes the counters (`-z`). */
export const callgrindControl = (pid, ...args) => execFileSync('callgrind_control', [...args, String(pid)], { stdio: 'ignore' });
