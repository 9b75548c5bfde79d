// Writes one section of bench/RESULTS.md (other benchmarks own the other sections) and the raw JSON.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, totalmem } from 'node:os';
import { join } from 'node:path';
import { root } from './poolgate.mjs';

export const RESULTS_PATH = join(root, 'bench', 'RESULTS.md');
const OUT_DIR = join(root, 'bench', 'out');

const HEADER = `# Benchmark results

Measured figures, one section per benchmark. Each section is rewritten by its script (\`npm run bench:…\`),
which starts the real service from \`bin/poolgate.js\` on this machine, drives it with autocannon (or
pgbench/sysbench for the database listeners), and writes the raw results as JSON into \`bench/out/\`
(not committed). The load generator runs on the same machine as the service, so the figures are a
lower bound for a dedicated server and are comparable only between runs on the same machine. Each
section names its date, machine and settings.
`;

export function machine() {
  const cpu = cpus();
  return {
    nproc: cpu.length,
    cpu: cpu[0]?.model?.trim() ?? 'unknown',
    memory_gib: Math.round(totalmem() / 2 ** 30),
    node: process.version,
    platform: `${process.platform}-${process.arch}`,
    // Other work on the machine skews every figure; the 1-minute load average at the start says how much.
    loadavg_1m: Math.round(loadavg()[0] * 100) / 100,
  };
}

/** Replaces the section that starts with `heading` (up to the next `## `), or appends it (bench:db's; the others write marked sections). */
export function writeSection(heading, body) {
  const text = existsSync(RESULTS_PATH) ? readFileSync(RESULTS_PATH, 'utf8') : HEADER;
  const lines = text.split('\n');
  const start = lines.findIndex((l) => l.trim() === heading);
  const section = [heading, '', ...body.trimEnd().split('\n'), ''];
  let out;
  if (start < 0) {
    out = [...lines.slice(0, lines.length - (lines.at(-1) === '' ? 1 : 0)), '', ...section];
  } else {
    let end = lines.findIndex((l, i) => i > start && l.startsWith('## '));
    if (end < 0) end = lines.length;
    out = [...lines.slice(0, start), ...section, ...lines.slice(end)];
  }
  writeFileSync(RESULTS_PATH, out.join('\n').replace(/\n{3,}/g, '\n\n').replace(/\n*$/, '\n'));
}

export function writeJson(name, data) {
  mkdirSync(OUT_DIR, { recursive: true });
  const path = join(OUT_DIR, name);
  writeFileSync(path, JSON.stringify(data, null, 2) + '\n');
  return path;
}

// Marked sections (issue 28 item 4, as pino does): each bench script owns the text between
// `<!-- bench:<id>:start -->` and `<!-- bench:<id>:end -->` and rewrites only that, when run with
// --write-results; headings, hand-written notes and every other section around the markers stay as they are.
const startMark = (id) => `<!-- bench:${id}:start -->`;
const endMark = (id) => `<!-- bench:${id}:end -->`;

/**
 * `text` with the marked section `id` replaced by `body` (markers kept), or — when the markers are not
 * there yet — with a new `## <heading>` section holding them appended at the end.
 */
export function replaceMarkedSection(text, id, body, heading = id) {
  if (!/^[a-z0-9:-]+$/.test(id)) throw new Error(`section id ${JSON.stringify(id)}: lower-case letters, digits, ':' and '-' only`);
  const start = text.indexOf(startMark(id));
  const end = text.indexOf(endMark(id));
  const block = `${startMark(id)}\n${body.trim()}\n${endMark(id)}`;
  if (start < 0 && end < 0) return `${text.replace(/\n*$/, '')}\n\n## ${heading}\n\n${block}\n`;
  if (start < 0 || end < start || text.indexOf(startMark(id), start + 1) >= 0 || text.indexOf(endMark(id), end + 1) >= 0) {
    throw new Error(`${RESULTS_PATH}: the markers of section ${id} are broken (one missing, out of order or doubled); fix them by hand`);
  }
  return text.slice(0, start) + block + text.slice(end + endMark(id).length);
}

/** The run's provenance line for a section: date, machine, load and the command that made it. */
export function provenance(m, date, command) {
  return [
    `- command: \`${command}\``,
    `- date: ${date.slice(0, 16).replace('T', ' ')} UTC`,
    `- machine: ${m.nproc} CPUs (${m.cpu}), ${m.memory_gib} GiB, ${m.platform}, Node.js ${m.node}; load average ${m.loadavg_1m} at the start${m.loadavg_1m_end === undefined ? '' : `, ${m.loadavg_1m_end} at the end`}`,
  ].join('\n');
}

/** Rewrites the marked section `id` of bench/RESULTS.md. */
export function writeMarkedSection(id, body, heading) {
  const text = existsSync(RESULTS_PATH) ? readFileSync(RESULTS_PATH, 'utf8') : HEADER;
  writeFileSync(RESULTS_PATH, replaceMarkedSection(text, id, body, heading));
}

/** Whether the script was asked to rewrite its RESULTS.md section (`npm run bench:… -- --write-results`). */
export const WRITE_RESULTS = process.argv.includes('--write-results');

/** How this run was asked for: its BENCH_* settings (and the script's other `env` names), `run` and the flags. */
export function benchCommand(run, env = []) {
  const set = Object.entries(process.env)
    .filter(([k]) => (k.startsWith('BENCH_') && k !== 'BENCH_SECTION_FROM') || env.includes(k))
    .map(([k, v]) => `${k}=${v}`);
  const args = process.argv.slice(2);
  return [...set, run, ...(args.length ? [...(run.startsWith('npm ') ? ['--'] : []), ...args] : [])].join(' ');
}

/**
 * A bench's last step: with --write-results, its marked section `id` of bench/RESULTS.md becomes the run's
 * provenance (command, date, machine) and `body`; without, RESULTS.md stays as it is (a smoke run) and the
 * raw JSON in bench/out/ is the only record. Returns whether the section was written.
 */
export function writeResults(id, heading, body, { command, m = machine(), date = new Date().toISOString() }) {
  if (!WRITE_RESULTS) {
    process.stderr.write(`[bench] ${RESULTS_PATH} untouched: pass --write-results to rewrite its bench:${id} section\n`);
    return false;
  }
  writeMarkedSection(id, `${provenance(m, date, command)}\n\n${body.trim()}`, heading);
  process.stderr.write(`[bench] wrote the bench:${id} section of ${RESULTS_PATH}\n`);
  return true;
}
