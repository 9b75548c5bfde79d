// Lock API benchmark: acquire→release cycles per second through the real `poolgate start` (embedded PGlite
// store, in-memory governor) under autocannon request sequences, three variants side by side in one run.
// Usage: npm run bench:lock   (env BENCH_DURATION seconds per run, default 5; BENCH_WARMUP, default 1;
// BENCH_ROUNDS, default 3, each running every variant once; BENCH_CONNECTIONS, default 10 = the pool's
// max_concurrent, so a cycle never waits or is refused unless the adaptive limit lowers it).
// Writes bench/out/lock-*.json and, with --write-results, the bench:lock section of bench/RESULTS.md.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import autocannon from 'autocannon';
import { api, startPoolgate } from './lib/poolgate.mjs';
import { benchCommand, machine, writeJson, writeResults } from './lib/results.mjs';

function intEnv(name, def, min) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return def;
  if (!/^\d+$/.test(raw) || Number(raw) < min) throw new Error(`${name} must be an integer ≥ ${min}, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

const settings = {
  duration_s: intEnv('BENCH_DURATION', 5, 1),
  warmup_s: intEnv('BENCH_WARMUP', 1, 0),
  rounds: intEnv('BENCH_ROUNDS', 3, 1),
  connections: intEnv('BENCH_CONNECTIONS', 10, 1),
  pool_max_concurrent: 10,
  store: 'pglite (embedded, fresh data dir)',
  access_log: 'every acquire logged to a file (POOLGATE_ACCESS_LOG_FILE, sample 1)',
  log_level: 'warn',
};
const log = (msg) => process.stderr.write(`bench:lock: ${msg}\n`);
const round = (n) => Math.round(n * 10) / 10;

const OUTCOME = JSON.stringify({
  status: 200,
  throttled: 0,
  rate: { limit: 1_000_000, remaining: 999_000, resetMs: 60_000 },
  headers: { 'x-ratelimit-limit': '1000000', 'x-ratelimit-remaining': '999000' },
});

/** Slots granted and not yet released: autocannon stops mid-sequence at the end of a run, leaving some held. */
const held = new Set();
/** The body of the first refused acquire of the current run, to say why in the notes. */
let firstRefusal = null;
/** Acquires granted and refused in the current run: a cycle counts only when its acquire was granted. */
let granted = 0;
let refused = 0;

/** One autocannon request sequence per connection: acquire, then the steps that use its slotId. */
function sequence(pool, key, steps) {
  const headers = { 'x-service-key': key, 'content-type': 'application/json' };
  const acquire = {
    method: 'POST',
    path: `/pools/${pool}/lock/acquire`,
    headers,
    onResponse: (status, body, context, headers) => {
      context.slotId = status === 200 ? JSON.parse(body).slotId : 'refused';
      if (status === 200) granted++;
      else refused++;
      // The effective limit says whether the adaptive limit had lowered the pool below max_concurrent.
      if (status !== 200) firstRefusal ??= `${status} ${body} (x-service-effective-limit ${headers?.['x-service-effective-limit']})`;
      if (status === 200) held.add(context.slotId);
    },
  };
  const after = steps.map((step) => ({
    method: 'POST',
    headers,
    body: step.body,
    setupRequest: (req, context) => ({ ...req, path: `/pools/${pool}/lock/${context.slotId}/${step.action}` }),
    onResponse: step.action === 'release' ? (status, body, context) => held.delete(context.slotId) : undefined,
  }));
  return [acquire, ...after];
}

/** One autocannon run; afterwards the slots its cut-off sequences left held are released, as a client would. */
async function run(url, pool, key, requests, duration) {
  firstRefusal = null;
  granted = 0;
  refused = 0;
  const r = await autocannon({ url, connections: settings.connections, duration, requests });
  for (const slotId of held) {
    await fetch(`${url}/pools/${pool}/lock/${slotId}/release`, { method: 'POST', headers: { 'x-service-key': key } });
    held.delete(slotId);
  }
  return r;
}

async function main() {
  const m = machine();
  // The access log goes to a temp dir that the run removes.
  const logDir = mkdtempSync(join(tmpdir(), 'poolgate-bench-lock-'));
  const dataLog = join(logDir, 'access.log');
  const live = await startPoolgate({ POOLGATE_LOG_LEVEL: settings.log_level, POOLGATE_ALLOW_PRIVATE_TARGETS: 'true', POOLGATE_ACCESS_LOG_FILE: dataLog });
  const lockUrl = `http://127.0.0.1:${live.listening.lock}`;
  log(`poolgate pid ${live.pid}; lock API on ${lockUrl}`);
  const rows = [];
  const notes = [];
  try {
    const boot = await live.admin(['bootstrap', '--team', 'Bench', '--email', 'bench@bench.test', '--plan', 'business']);
    // A fresh pool for every warm-up and every measured run: a run cut off by autocannon leaves leases held until
    // their 30 s term ends (the client vanished after the grant), and learned limits must not carry over.
    let n = 0;
    const freshPool = async () => {
      const made = await api(live.controlUrl, boot.token, 'POST', '/api/v1/pools', { origin: `https://127.0.0.2:${20000 + n}`, name: `lock-bench-${n++}` });
      if (made.status !== 201) throw new Error(`POST /api/v1/pools → ${made.status} ${JSON.stringify(made.body)}`);
      const pool = made.body.data.subdomain;
      const minted = await api(live.controlUrl, boot.token, 'POST', `/api/v1/pools/${pool}/keys`, { label: 'bench' });
      if (minted.status !== 201) throw new Error(`mint → ${minted.status}`);
      const key = minted.body.data.key;
      // The data plane picks pool and key up from the change feed.
      for (let i = 0; i < 100; i++) {
        const res = await fetch(`${lockUrl}/pools/${pool}/lock/acquire`, { method: 'POST', headers: { 'x-service-key': key } });
        const body = await res.json();
        if (res.status === 200) {
          await fetch(`${lockUrl}/pools/${pool}/lock/${body.slotId}/release`, { method: 'POST', headers: { 'x-service-key': key } });
          return { pool, key };
        }
        await new Promise((r) => setTimeout(r, 50));
      }
      throw new Error(`pool ${pool} never became usable on the lock API`);
    };

    const variants = [
      { name: 'acquire → release (no body)', steps: [{ action: 'release' }] },
      { name: 'acquire → renew → release', steps: [{ action: 'renew' }, { action: 'release' }] },
      // The reported outcomes feed this pool's adaptive limit and RPM gate (each run has a pool of its own).
      { name: 'acquire → release with an outcome report (status, rate, headers)', steps: [{ action: 'release', body: OUTCOME }] },
    ];
    // Rounds interleave the variants, so a burst of load from elsewhere on a shared machine hits them alike;
    // each variant reports its median round.
    const samples = new Map(variants.map((v) => [v.name, []]));
    for (let roundNo = 1; roundNo <= settings.rounds; roundNo++) {
      for (const v of variants) {
        if (settings.warmup_s > 0) {
          const w = await freshPool();
          await run(lockUrl, w.pool, w.key, sequence(w.pool, w.key, v.steps), settings.warmup_s);
        }
        const { pool, key } = await freshPool();
        log(`round ${roundNo}/${settings.rounds}, ${v.name}: ${settings.duration_s} s on pool ${pool}`);
        const r = await run(lockUrl, pool, key, sequence(pool, key, v.steps), settings.duration_s);
        const statuses = Object.fromEntries(Object.entries(r.statusCodeStats ?? {}).map(([code, st]) => [code, Number(st.count)]));
        samples.get(v.name).push({
          round: roundNo,
          requests: r.requests.total,
          rps: round(r.requests.average),
          cycles_per_s: round(granted / r.duration),
          granted,
          refused,
          latency_ms: { mean: round(r.latency.average), p50: r.latency.p50, p99: r.latency.p99, max: r.latency.max },
          errors: r.errors,
          timeouts: r.timeouts,
          non2xx: r.non2xx,
          statuses,
          duration_s: r.duration,
          first_refusal: firstRefusal,
        });
      }
    }
    for (const v of variants) {
      const all = samples.get(v.name);
      const sorted = [...all].sort((a, b) => a.cycles_per_s - b.cycles_per_s);
      const median = sorted[Math.floor(sorted.length / 2)];
      rows.push({ name: v.name, requests_per_cycle: 1 + v.steps.length, ...median, min_cycles_per_s: sorted[0].cycles_per_s, max_cycles_per_s: sorted.at(-1).cycles_per_s, rounds: all });
      const refusedTotal = all.reduce((n, x) => n + x.refused, 0);
      if (refusedTotal > 0) {
        const first = all.find((x) => x.first_refusal)?.first_refusal;
        notes.push(`${v.name}: ${refusedTotal} acquires refused over ${all.length} rounds; the first said ${first}. A refused acquire's renew/release answers 404 / released:false.`);
      }
    }
  } finally {
    await live.stop();
    rmSync(logDir, { recursive: true, force: true });
  }

  // Say plainly when the spread between rounds is larger than the difference between rows.
  const overlap = rows.every((a) => rows.every((b) => a.min_cycles_per_s <= b.max_cycles_per_s && b.min_cycles_per_s <= a.max_cycles_per_s));
  if (overlap && rows.length > 1) {
    notes.unshift('The rows\' min–max ranges over the rounds overlap: at this machine load the differences between rows are within the run-to-run spread, so the ratios are not evidence of a difference.');
  }
  const stamp = new Date().toISOString();
  const path = writeJson(`lock-${stamp.replace(/[:.]/g, '-')}.json`, { date: stamp, machine: m, settings, rows });
  writeJson('lock-latest.json', { date: stamp, machine: m, settings, rows });
  const base = rows[0].cycles_per_s;
  const table = [
    '| sequence (per connection) | granted cycles/s (median) | min–max over rounds | requests/s | p50 ms | p99 ms | vs first row | refused acquires | errors |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...rows.map((r) => `| ${r.name} | ${r.cycles_per_s} | ${r.min_cycles_per_s}–${r.max_cycles_per_s} | ${r.rps} | ${r.latency_ms.p50} | ${r.latency_ms.p99} | ${(r.cycles_per_s / base).toFixed(2)}× | ${r.refused} | ${r.errors} |`),
  ];
  writeResults('lock', 'Lock API', `\`npm run bench:lock\` (bench/lock.mjs): \`poolgate start\` with every role in one process on the embedded
PGlite store and the in-memory governor; pools made through \`POST /api/v1/pools\` (default max_concurrent
${settings.pool_max_concurrent}) and keys minted through the Control API, a fresh pool for each warm-up and each row (a run
cut off mid-sequence leaves leases held until their term ends, like crashed clients). Each autocannon connection runs a request sequence:
\`POST /pools/{pool}/lock/acquire\`, then the listed calls on the granted slotId. A cycle is one full sequence;
with ${settings.connections} connections and max_concurrent ${settings.pool_max_concurrent} no acquire waits or is refused, so the figure is the
lock API's own cost (its node:http listener, pool auth, governor, lease registry, access log), not queueing — except
where the pool's adaptive limit, fed by the reported outcomes, lowers the effective limit below the connections:
those acquires are refused (429), counted apart, and only granted cycles count.

- settings: ${settings.rounds} rounds, each running every row once for ${settings.duration_s} s after a ${settings.warmup_s} s warm-up (median round shown), ${settings.connections} connections, no pipelining, ${settings.access_log}, service log level \`${settings.log_level}\`

${table.join('\n')}
${notes.length ? `\nNotes:\n\n${notes.map((n) => `- ${n}`).join('\n')}\n` : ''}`, { command: benchCommand('npm run bench:lock'), m, date: stamp });
  log(`wrote ${path}`);
}

main().catch((err) => {
  process.stderr.write(`bench:lock failed: ${err.stack ?? err}\n`);
  process.exit(1);
});
