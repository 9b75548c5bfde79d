// Reading instruction counts from a process running under valgrind's callgrind (bench:instructions, bench:stalls).
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

/** The wrapper that runs a process under callgrind, counting off until `callgrind_control -i on` (start-up would take minutes). */
export const callgrindWrap = (dir) => ['valgrind', '--tool=callgrind', '--instr-atstart=no', `--callgrind-out-file=${dir}/cg.%p`];

/**
 * The total Ir of the callgrind dump(s) written for `pid` since the counters were last zeroed (a dump holds every
 * thread); `keep`: a folder the dumps are copied to (callgrind_annotate shows the native functions); `parts`: names
 * of native functions whose inclusive Ir is added to it by name (`parts.ir[name]`, from callgrind_annotate).
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
      // `  64,896,701 (69.25%)  ???:Builtins_JSToWasmWrapper [/…/node]`; recursive cycles are listed as `name'2`.
      const line = text.split('\n').find((l) => l.includes(`:${name} [`) || l.includes(`:${name}(`));
      parts.ir[name] = line ? Number(line.trim().split(/\s+/)[0].replaceAll(',', '')) : 0;
    }
  }
  return ir;
}

/** callgrind_control's verb on a pid: `-i on|off` (instrumentation), `-z` (zero the counters). */
export function callgrindControl(pid, ...args) {
  execFileSync('callgrind_control', [...args, String(pid)], { stdio: 'ignore' });
}
