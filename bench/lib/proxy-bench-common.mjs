// Small helpers the proxy bench's modes share: integer settings from the environment, medians, ratios,
// CPU lists, and the notes every section carries about the run's conditions.
import { availableParallelism } from 'node:os';

export function intEnv(name, def, min) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return def;
  if (!/^\d+$/.test(raw) || Number(raw) < min) throw new Error(`${name} must be an integer ≥ ${min}, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

export function median(xs) {
  const v = xs.filter((x) => typeof x === 'number' && Number.isFinite(x)).sort((a, b) => a - b);
  if (v.length === 0) return null;
  const mid = Math.floor(v.length / 2);
  return v.length % 2 ? v[mid] : Math.round(((v[mid - 1] + v[mid]) / 2) * 1000) / 1000;
}

export const ratio = (a, b) => (typeof a === 'number' && typeof b === 'number' && b > 0 ? Math.round((a / b) * 100) / 100 : null);
export const fmt = (n) => (n === null || n === undefined ? '–' : String(n));

/** How many CPUs a taskset list such as "0-6,8" names. */
export function cpuCount(list) {
  return list.split(',').reduce((n, part) => {
    const [a, b] = part.split('-').map(Number);
    return n + (b === undefined ? 1 : b - a + 1);
  }, 0);
}

/**
 * Where the proxy and the rest run: BENCH_PIN=0 for no pinning; else BENCH_PIN_PROXY (default the last CPU)
 * and BENCH_PIN_LOAD (default every other CPU) — on 2 cores, the proxy on one and load generator and origin
 * on the other (issue 29). null when the machine has one CPU or pinning is off.
 */
export function pinPlan() {
  const n = availableParallelism();
  if (process.env.BENCH_PIN === '0' || n < 2) return null;
  const proxy = process.env.BENCH_PIN_PROXY || String(n - 1);
  const load = process.env.BENCH_PIN_LOAD || (n === 2 ? '0' : `0-${n - 2}`);
  return { proxy, load, proxy_cpus: cpuCount(proxy) };
}

/** Conditions that make a run's figures doubtful, said in its section. */
export function conditionNotes(m) {
  const notes = [];
  if (!/^v24\./.test(m.node)) notes.push(`Node.js ${m.node}: issue 29's targets are stated for Node 24.`);
  if (m.loadavg_1m > m.nproc * 0.5) notes.push(`The machine was not quiet (load average ${m.loadavg_1m} on ${m.nproc} CPUs at the start): figures are a smoke run, not results.`);
  return notes;
}
