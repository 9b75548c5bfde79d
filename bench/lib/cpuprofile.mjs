// Reads a V8 .cpuprofile (node --cpu-prof) and prints the functions with the most self time, and the
// same time summed per source file. Usage: node bench/lib/cpuprofile.mjs <file.cpuprofile> [top=30]
import { readFileSync } from 'node:fs';

const [file, topArg] = process.argv.slice(2);
if (!file) {
  console.error('usage: node bench/lib/cpuprofile.mjs <file.cpuprofile> [top]');
  process.exit(2);
}
const top = Number(topArg ?? 30);
const profile = JSON.parse(readFileSync(file, 'utf8'));
const byId = new Map(profile.nodes.map((n) => [n.id, n]));
// Each sample names the node running then; timeDeltas[i] is the time before sample i.
const selfUs = new Map();
for (let i = 0; i < profile.samples.length; i++) {
  const id = profile.samples[i];
  selfUs.set(id, (selfUs.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0));
}
const total = [...selfUs.values()].reduce((a, b) => a + b, 0);
const fnTotals = new Map();
const fileTotals = new Map();
for (const [id, us] of selfUs) {
  const { functionName, url, lineNumber } = byId.get(id).callFrame;
  const short = url.replace(/^file:\/\/.*?\/(node_modules|dist)\//, '$1/').replace(/^file:\/\//, '');
  const fnKey = `${functionName || '(anonymous)'} ${short}:${lineNumber + 1}`;
  fnTotals.set(fnKey, (fnTotals.get(fnKey) ?? 0) + us);
  const fileKey = short || '(native/vm)';
  fileTotals.set(fileKey, (fileTotals.get(fileKey) ?? 0) + us);
}
const pct = (us) => `${((100 * us) / total).toFixed(1).padStart(5)}%`;
console.log(`total sampled ${(total / 1e6).toFixed(2)} s`);
console.log('\nself time by function:');
for (const [k, us] of [...fnTotals].sort((a, b) => b[1] - a[1]).slice(0, top)) console.log(`${pct(us)}  ${k}`);
console.log('\nself time by file:');
for (const [k, us] of [...fileTotals].sort((a, b) => b[1] - a[1]).slice(0, top)) console.log(`${pct(us)}  ${k}`);
