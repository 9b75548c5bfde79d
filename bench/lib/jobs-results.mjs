// The RESULTS.md section of bench/jobs.ts and bench/jobs-database.ts: sync requests against async spills on the same
// pool, then how fast the runner drains the spilled jobs. One section per script and store engine, since a run
// measures one engine.
import { benchCommand, machine, writeResults } from './results.mjs';

// Taken when the script loads this module, before it starts anything: the load average of the run's start.
const atStart = machine();

/** `report` is what the script prints: { engine, load, connections, seconds, sync, spill, ratio, drained }. */
export function writeJobsResults(script, heading, what, report) {
  const row = (r) => `| ${r.title} | ${r.rps} | ${r.p50} | ${r.p99} | ${r.accepted} of ${r.requests} | ${r.non2xx} | ${r.errors} |`;
  const engine = report.engine === 'postgres' ? 'PostgreSQL store (a fresh local database)' : 'embedded store (PGlite)';
  return writeResults(`${script}-${report.engine}`, `${heading}, ${report.engine === 'postgres' ? 'PostgreSQL' : 'embedded'} store`, `${what}
${engine}; autocannon, ${report.connections} connections, ${report.seconds} s per row; load average ${report.load.join(' / ')} (1/5/15 min) at the end.

| run | req/s | p50 ms | p99 ms | 202 (spilled) | non-2xx | errors |
|---|---:|---:|---:|---:|---:|---:|
${row(report.sync)}
${row(report.spill)}

Spill / sync: ${report.ratio}. The runner drained ${report.drained.jobs} jobs in ${(report.drained.ms / 1000).toFixed(1)} s after the spill ended (${report.drained.jobsPerSecond} jobs/s).
`, { command: benchCommand(`npx tsx bench/${script}.ts`), m: atStart });
}
