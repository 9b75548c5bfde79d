// CPU time a process spends per unit of work during one run: the efficiency figure, much steadier than
// throughput on a shared machine, since it does not depend on how much CPU the process was given.
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';

/** [utime, stime] in clock ticks: fields 14 and 15 of /proc/<pid>/stat (after the parenthesised name). */
function ticksOf(pid) {
  try {
    const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return [Number(f[11]), Number(f[12])];
  } catch {
    return null;
  }
}

/** The pid's child processes (nginx's workers), read once: their time is not in the parent's until they exit. */
function childrenOf(pid) {
  try {
    return readdirSync(`/proc/${pid}/task`).flatMap((tid) =>
      readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number),
    );
  } catch {
    return [];
  }
}

let hz = 0;

/**
 * Starts counting the CPU time of `pid` (threads included) and of its child processes. `per(n)` gives
 * { total, user, system } µs per unit of work since the start, or null (no pid, or it exited).
 */
export function cpuMeter(pid) {
  if (!pid) return { per: () => null };
  hz ||= Number(execFileSync('getconf', ['CLK_TCK']).toString().trim()) || 100;
  const pids = [pid, ...childrenOf(pid)];
  const sample = () => {
    let user = 0;
    let system = 0;
    for (const p of pids) {
      const t = ticksOf(p);
      if (t === null) return null;
      user += t[0];
      system += t[1];
    }
    return [user, system];
  };
  const start = sample();
  return {
    per(units) {
      const end = start === null ? null : sample();
      if (end === null || !units) return null;
      const us = (ticks) => Math.round(((ticks / hz) * 1e6 * 10) / units) / 10;
      return { total: us(end[0] + end[1] - start[0] - start[1]), user: us(end[0] - start[0]), system: us(end[1] - start[1]) };
    },
  };
}
