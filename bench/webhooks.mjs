// Webhook deliveries benchmark. Two parts, each run side by side in one go:
//  1. Envelope bodies: event-loop delay (perf_hooks.monitorEventLoopDelay) while large envelopes are
//     serialised and hashed inline versus in the piscina worker pool (src/webhooks/envelope-body.ts).
//  2. Deliveries: the real `poolgate start` on a fresh PostgreSQL database, a local https receiver in its own
//     process (bench/lib/webhook-receiver.mjs), 4 destinations. A burst of events already in the outbox
//     (deliveries/s until the last arrival; every delivery checked to have reached its own destination, none
//     lost), and a steady rate of job completions, each enqueued with enqueueJobEvent in its own transaction
//     as the jobs runner does (completion → arrival p50/p99). Both against the issue-18 targets, with the CPU
//     time per delivery of poolgate and of the receiver.
//     Each run has its floor, measured right after it in the same run (issue 28 item 5: absolute rates do not
//     carry between machines): undici POSTing the same signed bodies to the same receiver with nothing else
//     (bench/lib/webhook-floor.mjs), and the target is a ratio to it: poolgate CPU per delivery ≤ 1.5× the floor's.
// Usage: npm run bench:webhooks [-- --write-results]  (env BENCH_EVENTS burst events, default 20000; BENCH_RATE steady
// events/s, default 1000; BENCH_STEADY_S, default 10; BENCH_SKIP_ENVELOPES=1 skips part 1 (and writes no RESULTS.md);
// BENCH_FLOOR=0 skips the floor; BENCH_CPU_PROF=dir writes poolgate's .cpuprofile there; BENCH_POOLGATE_BIN=another
// build's bin/poolgate.js, for a before/after comparison; POOLGATE_TEST_PG_URL).
// Writes bench/out/webhooks-*.json; with --write-results also the text between the bench:webhooks markers of
// bench/RESULTS.md.
import { execFileSync, fork } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:https';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import pg from 'pg';
import { api, startPoolgate } from './lib/poolgate.mjs';
import { benchCommand, machine, provenance, writeJson, writeMarkedSection, WRITE_RESULTS } from './lib/results.mjs';
import { cpuMeter } from './lib/cpu.mjs';
import { freshDatabase } from './lib/fresh-database.mjs';

const { enqueueJobEvent } = await import('../dist/src/webhooks/outbox.js');
const { EVENT_TYPE } = await import('../dist/src/jobs/job-event.js');
const { envelopeBodyInline, envelopeBodyInWorker, closeEnvelopeWorkers, OFFLOAD_AT_BYTES } = await import('../dist/src/webhooks/envelope-body.js');

function intEnv(name, def, min) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return def;
  if (!/^\d+$/.test(raw) || Number(raw) < min) throw new Error(`${name} must be an integer ≥ ${min}, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

const settings = {
  burst_events: intEnv('BENCH_EVENTS', 20000, 1),
  destinations: 4,
  steady_rate: intEnv('BENCH_RATE', 1000, 1),
  steady_s: intEnv('BENCH_STEADY_S', 10, 1),
  concurrency: 256,
  per_destination_ceiling: 64,
  store: 'postgresql (local, fresh database)',
};
const PG_URL = process.env.POOLGATE_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const log = (msg) => process.stderr.write(`bench:webhooks: ${msg}\n`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pct = (sorted, p) => (sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] : NaN);
const r1 = (x) => Math.round(x * 10) / 10;
/** Issue 18's targets, and issue 28's ratio to the floor measured in the same run. */
const TARGET = { burst_per_second: 5000, steady_p99_ms: 100, cpu_over_floor: 1.5 };
const FLOOR = process.env.BENCH_FLOOR !== '0';

function bigEvent(bytes) {
  return {
    jobId: `job_${randomBytes(8).toString('hex')}`,
    poolId: 1,
    poolHost: 'bench.pools.localhost',
    status: 'completed',
    reason: 'requested',
    createdAt: Date.now(),
    completedAt: Date.now(),
    // Text with quotes and a non-ASCII character, so serialising has escaping and UTF-8 work to do.
    detail: { kind: 'http', status: 200, headers: { 'content-type': 'application/json' }, body: '{"k":"é"}'.repeat(Math.ceil(bytes / 10)).slice(0, bytes) },
  };
}

/** Event-loop delay and main-thread busy time while `count` envelopes of `bytes` are made by `make`, two at a time. */
async function loopDelay(bytes, count, make) {
  const event = bigEvent(bytes);
  const h = monitorEventLoopDelay({ resolution: 1 });
  await sleep(50);
  h.enable();
  const elu0 = performance.eventLoopUtilization();
  const started = performance.now();
  let next = 0;
  const lane = async () => {
    while (next < count) {
      next++;
      await make(event);
      // A runner does other work between jobs: a short gap lets the loop idle, so busy time is the envelope's.
      await sleep(1);
    }
  };
  await Promise.all([lane(), lane()]);
  const elapsed = performance.now() - started;
  // Main-thread busy time: what the event loop could not spend on anything else.
  const busy = performance.eventLoopUtilization(elu0).active;
  h.disable();
  return {
    p50_ms: r1(h.percentile(50) / 1e6), p99_ms: r1(h.percentile(99) / 1e6), max_ms: r1(h.max / 1e6),
    per_envelope_ms: r1(elapsed / count), main_thread_ms_per_envelope: Math.round((busy / count) * 100) / 100,
  };
}

async function envelopeBench() {
  const rows = [];
  for (const [label, bytes, count] of [['64 KiB', 64 * 1024, 200], ['128 KiB', 128 * 1024, 150], ['256 KiB', 256 * 1024, 100], ['1 MiB', 1024 * 1024, 40], ['4 MiB', 4 * 1024 * 1024, 20]]) {
    await envelopeBodyInWorker(bigEvent(1024)); // warm the worker threads
    const inline = await loopDelay(bytes, count, async (e) => envelopeBodyInline(e));
    const worker = await loopDelay(bytes, count, (e) => envelopeBodyInWorker(e));
    rows.push({ size: label, bytes, count, inline, worker });
    log(`envelope ${label}: inline busy ${inline.main_thread_ms_per_envelope} ms p99 ${inline.p99_ms} ms; worker busy ${worker.main_thread_ms_per_envelope} ms p99 ${worker.p99_ms} ms`);
  }
  await closeEnvelopeWorkers();
  return rows;
}

function selfSigned() {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-receiver-'));
  const keyFile = join(dir, 'key.pem');
  const certFile = join(dir, 'cert.pem');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', keyFile, '-out', certFile,
    '-days', '2', '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost'], { stdio: 'ignore' });
  return { dir, keyFile, certFile };
}

/** The receiver process: arrivals by `job|webhook id` (first arrival), with the path each came to. */
async function startReceiver(cert) {
  const child = fork(new URL('./lib/webhook-receiver.mjs', import.meta.url), [cert.certFile, cert.keyFile], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  const arrivals = new Map();
  const paths = new Map();
  let count = 0;
  let connections = 0;
  const port = await new Promise((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`receiver exited (${code})`)));
    child.on('message', (m) => {
      if (m.port) return resolve(m.port);
      connections = m.connections;
      for (const [job, hook, path, at] of m.arrivals) {
        count++;
        const key = `${job}|${hook}`;
        if (!arrivals.has(key)) arrivals.set(key, at);
        paths.set(key, path);
      }
    });
  });
  return {
    url: `https://127.0.0.1:${port}`,
    pid: child.pid,
    arrivals,
    paths,
    get count() { return count; },
    get connections() { return connections; },
    close: () => new Promise((r) => { child.once('exit', r); child.send('stop'); }),
  };
}

/** The floor process (bench/lib/webhook-floor.mjs): prepare → ready, go → done. */
async function startFloor(caFile) {
  const child = fork(new URL('./lib/webhook-floor.mjs', import.meta.url), [caFile], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  const next = (key) => new Promise((resolve, reject) => {
    const onExit = (code) => reject(new Error(`webhook floor exited (${code})`));
    child.once('exit', onExit);
    const onMessage = (m) => {
      if (m.error) reject(new Error(`webhook floor: ${m.error}`));
      else if (!(key in m)) return;
      else resolve(m[key]);
      child.off('message', onMessage);
      child.off('exit', onExit);
    };
    child.on('message', onMessage);
  });
  await next('started');
  return {
    pid: child.pid,
    /** Bodies made, connections not yet open: the clock starts at run(). */
    async prepare(p) {
      const ready = next('ready');
      child.send({ prepare: p });
      await ready;
    },
    async run() {
      const done = next('done');
      child.send({ go: true });
      return done;
    },
    close: () => new Promise((r) => { if (child.exitCode !== null) return r(); child.once('exit', r); child.send('stop'); }),
  };
}

/** poolgate's run against its floor: CPU per delivery (issue 28's target ≤ 1.5×) and deliveries/s as ratios. */
function againstFloor(row, floorRow, { rates }) {
  if (!floorRow) return;
  const ratio = (a, b) => (typeof a === 'number' && typeof b === 'number' && b > 0 ? Math.round((a / b) * 100) / 100 : null);
  row.cpu_over_floor = ratio(row.poolgate_cpu_us_per_delivery, floorRow.floor_cpu_us_per_delivery);
  // At a steady rate both send what the schedule offers: only the burst's rates compare.
  row.per_second_over_floor = rates ? ratio(row.per_second, floorRow.per_second) : null;
  row.cpu_over_floor_met = row.cpu_over_floor !== null && row.cpu_over_floor <= TARGET.cpu_over_floor;
  log(`${row.run}: poolgate CPU per delivery ${row.cpu_over_floor}× the floor's (target ≤ ${TARGET.cpu_over_floor}), deliveries/s ${row.per_second_over_floor}× the floor's`);
}

async function main() {
  const m = machine();
  const command = benchCommand('npm run bench:webhooks');
  const envelopes = process.env.BENCH_SKIP_ENVELOPES ? null : await envelopeBench();

  const fresh = await freshDatabase(PG_URL);
  const cert = selfSigned();
  const receiver = await startReceiver(cert);
  const floor = FLOOR ? await startFloor(cert.certFile) : null;
  const svc = await startPoolgate({
    DATABASE_URL: fresh.url,
    POOLGATE_ALLOW_PRIVATE_TARGETS: 'true',
    POOLGATE_WEBHOOK_CA_FILE: cert.certFile,
    POOLGATE_WEBHOOK_CONCURRENCY: String(settings.concurrency),
    POOLGATE_WEBHOOK_DESTINATION_CONCURRENCY: String(settings.per_destination_ceiling),
    POOLGATE_LOG_LEVEL: 'warn',
  }, {
    ...(process.env.BENCH_CPU_PROF ? { nodeArgs: ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF}`] } : {}),
    ...(process.env.BENCH_POOLGATE_BIN ? { bin: process.env.BENCH_POOLGATE_BIN } : {}),
  });
  const db = new pg.Pool({ connectionString: fresh.url, max: 8 });
  let result;
  try {
    const boot = await svc.admin(['bootstrap', '--team', 'Bench', '--email', 'bench@bench.test', '--plan', 'business']);
    const { rows } = await db.query(
      `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, async_enabled)
       VALUES ($1, 'bench', 'bench', 'http', 'https://api.example.test', 'api.example.test', true) RETURNING id`,
      [boot.team.id],
    );
    const pool = { id: rows[0].id, host: 'bench.pools.localhost' };
    /** The path each destination id must be delivered to. */
    const pathOf = new Map();
    /** Each destination as the floor needs it: id, URL and signing secret. */
    const destinations = [];
    for (let i = 0; i < settings.destinations; i++) {
      const res = await api(svc.controlUrl, boot.token, 'POST', '/api/v1/webhooks', { name: `dest-${i}`, url: `${receiver.url}/d${i}`, pool_ids: [pool.id] });
      if (res.status !== 201) throw new Error(`create webhook: ${res.status} ${JSON.stringify(res.body)}`);
      pathOf.set(String(res.body.data.id), `/d${i}`);
      destinations.push({ id: res.body.data.id, url: `${receiver.url}/d${i}`, secret: res.body.data.signing_secret });
    }
    /**
     * The floor for one run: the same number of signed POSTs (same bodies, same destinations, same limits) by
     * undici alone, with the CPU time per delivery of the floor process and the receiver; `rate` paces it.
     */
    let floorRuns = 0;
    const floorRun = async (run, events, rate) => {
      if (!floor) return null;
      // Quiet first: deliveries of poolgate's run still arriving (an enqueue that committed late) would be
      // counted in the receiver's CPU time.
      for (let last = -1, i = 0; i < 100 && receiver.count !== last; i++) {
        last = receiver.count;
        await sleep(300);
      }
      const tag = `floor${++floorRuns}`;
      await floor.prepare({ tag, events, destinations, concurrency: settings.concurrency, perDestination: settings.per_destination_ceiling, eventType: EVENT_TYPE.completed, pool, rate });
      const before = receiver.count;
      const mine = () => [...receiver.arrivals.keys()].filter((k) => k.startsWith(`${tag}_`)).length;
      const floorCpu = cpuMeter(floor.pid);
      const recvCpu = cpuMeter(receiver.pid);
      const r = await floor.run();
      // The receiver reports arrivals every 10 ms: wait until it has counted them all.
      for (let i = 0; i < 200 && receiver.count - before < r.deliveries; i++) await sleep(10);
      const arrived = mine();
      const row = {
        run: `floor (undici alone), ${run}`,
        deliveries: arrived,
        expected: r.deliveries,
        failed: r.failed,
        per_second: r1(r.deliveries / (r.elapsed_ms / 1000)),
        p50_ms: r.p50_ms,
        p99_ms: r.p99_ms,
        floor_cpu_us_per_delivery: floorCpu.per(r.deliveries)?.total ?? null,
        receiver_cpu_us_per_delivery: recvCpu.per(receiver.count - before)?.total ?? null,
      };
      log(JSON.stringify(row));
      return row;
    };
    const event = (jobId) => ({ jobId, poolId: pool.id, poolHost: pool.host, status: 'completed', reason: 'busy', createdAt: Date.now(), completedAt: Date.now(),
      detail: { kind: 'http', status: 200, headers: { 'content-type': 'application/json' }, body: '{"result":"ok"}' } });
    const enqueuedAt = new Map();
    const enqueueOne = async () => {
      const jobId = `job_${randomBytes(8).toString('hex')}`;
      const c = await db.connect();
      try {
        await c.query('BEGIN');
        const tx = { query: async (text, params) => { const r = await c.query(text, params); return { rows: r.rows, rowCount: r.rowCount ?? 0 }; } };
        await enqueueJobEvent(tx, event(jobId));
        await c.query('COMMIT');
        enqueuedAt.set(jobId, performance.timeOrigin + performance.now());
      } finally {
        c.release();
      }
      return jobId;
    };
    /**
     * A burst: `n` completed events land in the outbox in one transaction (the rows enqueueJobEvent writes,
     * inserted 1,000 per statement), visible to the deliverer at its commit; returns the job ids and the commit time.
     */
    const enqueueBurst = async (n) => {
      const ids = Array.from({ length: n }, () => `job_${randomBytes(8).toString('hex')}`);
      const c = await db.connect();
      try {
        await c.query('BEGIN');
        for (let i = 0; i < n; i += 1000) {
          const chunk = ids.slice(i, i + 1000);
          const bodies = chunk.map((id) => envelopeBodyInline(event(id)));
          await c.query(
            `INSERT INTO webhook_deliveries (webhook_endpoint_id, job_id, pool_id, event_type, body, body_sha256)
             SELECT w.id, e.job_id, $1, $2, e.body, e.sha
               FROM unnest($3::text[], $4::bytea[], $5::text[]) AS e(job_id, body, sha)
               CROSS JOIN pool_webhooks pw JOIN webhook_endpoints w ON w.id = pw.webhook_endpoint_id
              WHERE pw.pool_id = $1 AND w.disabled = false`,
            [pool.id, EVENT_TYPE.completed, chunk, bodies.map((b) => Buffer.from(b.bytes)), bodies.map((b) => b.sha256)],
          );
        }
        await c.query('SELECT pg_notify($1, $2)', ['poolgate_deliveries', String(pool.id)]);
        await c.query('COMMIT');
        const at = performance.timeOrigin + performance.now();
        for (const id of ids) enqueuedAt.set(id, at);
        return { ids, at };
      } finally {
        c.release();
      }
    };
    const latencies = (jobIds) => {
      const out = [];
      for (const [key, at] of receiver.arrivals) {
        const job = key.split('|')[0];
        if (jobIds.has(job)) out.push(at - enqueuedAt.get(job));
      }
      return out.sort((a, b) => a - b);
    };
    const waitDelivered = async (jobIds, timeoutMs) => {
      const want = jobIds.size * settings.destinations;
      const end = Date.now() + timeoutMs;
      while (latencies(jobIds).length < want && Date.now() < end) await sleep(20);
      return latencies(jobIds);
    };
    /** Deliveries that reached a path other than their destination's. */
    const misrouted = (jobIds) => [...receiver.paths].filter(([k, path]) => jobIds.has(k.split('|')[0]) && pathOf.get(k.split('|')[1]) !== path).length;

    // Warm-up: connections and the deliverer's first claims.
    const warm = new Set();
    for (let i = 0; i < 50; i++) warm.add(await enqueueOne());
    await waitDelivered(warm, 30_000);

    // Burst: every event lands in the outbox at once (one commit, as after an outage of the deliverer or a
    // wave of completions); deliveries/s from that commit to the last arrival.
    const poolgateCpu = cpuMeter(svc.pid);
    const receiverCpu = cpuMeter(receiver.pid);
    const requests0 = receiver.count;
    const e0 = performance.now();
    const { ids: burstIds, at: t0 } = await enqueueBurst(settings.burst_events);
    const burst = new Set(burstIds);
    const enqueuedIn = performance.now() - e0;
    const burstLat = await waitDelivered(burst, 300_000);
    const burstRequests = receiver.count - requests0;
    const lastArrival = Math.max(...[...receiver.arrivals].filter(([k]) => burst.has(k.split('|')[0])).map(([, at]) => at));
    const burstRow = {
      run: `burst: ${settings.burst_events} events × ${settings.destinations} destinations`,
      deliveries: burstLat.length,
      expected: burst.size * settings.destinations,
      misrouted: misrouted(burst),
      duplicates: burstRequests - burstLat.length,
      enqueued_in_ms: Math.round(enqueuedIn),
      per_second: r1(burstLat.length / ((lastArrival - t0) / 1000)),
      p50_ms: r1(pct(burstLat, 50)),
      p99_ms: r1(pct(burstLat, 99)),
      tls_connections: receiver.connections,
      poolgate_cpu_us_per_delivery: poolgateCpu.per(burstRequests)?.total ?? null,
      receiver_cpu_us_per_delivery: receiverCpu.per(burstRequests)?.total ?? null,
    };
    burstRow.target = `≥ ${TARGET.burst_per_second}/s, none lost or misrouted`;
    burstRow.met = burstRow.per_second >= TARGET.burst_per_second && burstRow.deliveries === burstRow.expected && burstRow.misrouted === 0;
    log(JSON.stringify(burstRow));
    const burstFloor = await floorRun(`burst: ${settings.burst_events} events × ${settings.destinations} destinations`, settings.burst_events);
    againstFloor(burstRow, burstFloor, { rates: true });

    // Steady: job completions at a fixed rate, each in its own transaction; the latency a receiver sees.
    const steady = new Set();
    const poolgateCpu2 = cpuMeter(svc.pid);
    const receiverCpu2 = cpuMeter(receiver.pid);
    const requests1 = receiver.count;
    const steadyStart = performance.now();
    const total = settings.steady_rate * settings.steady_s;
    let late = 0;
    const enqueues = [];
    for (let i = 0; i < total; i++) {
      const due = steadyStart + (i * 1000) / settings.steady_rate;
      const wait = due - performance.now();
      if (wait > 1) await sleep(wait);
      else if (wait < -100) late++;
      enqueues.push(enqueueOne().then((id) => steady.add(id)));
    }
    const offeredS = (performance.now() - steadyStart) / 1000;
    // Every event committed before counting: one still in its transaction would be missing from the expected.
    await Promise.all(enqueues);
    await sleep(500);
    const steadyLat = await waitDelivered(steady, 120_000);
    const steadyRequests = receiver.count - requests1;
    const steadyRow = {
      run: `steady: ${settings.steady_rate} events/s × ${settings.destinations} destinations for ${settings.steady_s} s`,
      deliveries: steadyLat.length,
      expected: steady.size * settings.destinations,
      misrouted: misrouted(steady),
      duplicates: steadyRequests - steadyLat.length,
      offered_events_per_second: r1(total / offeredS),
      per_second: r1(steadyLat.length / offeredS),
      p50_ms: r1(pct(steadyLat, 50)),
      p99_ms: r1(pct(steadyLat, 99)),
      poolgate_cpu_us_per_delivery: poolgateCpu2.per(steadyRequests)?.total ?? null,
      receiver_cpu_us_per_delivery: receiverCpu2.per(steadyRequests)?.total ?? null,
    };
    steadyRow.target = `p99 ≤ ${TARGET.steady_p99_ms} ms`;
    steadyRow.met = steadyRow.p99_ms <= TARGET.steady_p99_ms && steadyRow.deliveries === steadyRow.expected && steadyRow.misrouted === 0;
    if (late > 0) log(`steady: the generator fell behind its schedule ${late} times (the machine is loaded)`);
    log(JSON.stringify(steadyRow));
    const steadyFloor = await floorRun(`steady: ${settings.steady_rate} events/s × ${settings.destinations} destinations for ${settings.steady_s} s`, total, settings.steady_rate);
    againstFloor(steadyRow, steadyFloor, { rates: false });
    result = { burstRow, steadyRow, burstFloor, steadyFloor, receiverRequests: receiver.count };
  } finally {
    await db.end();
    await svc.stop();
    await floor?.close();
    await receiver.close();
    rmSync(cert.dir, { recursive: true, force: true });
    await fresh.drop();
  }
  const date = new Date().toISOString();
  const floors = [result.burstFloor, result.steadyFloor].filter(Boolean);
  const raw = { date, command, machine: m, settings, target: TARGET, offload_at_bytes: OFFLOAD_AT_BYTES, envelopes, deliveries: [result.burstRow, result.steadyRow], floors };
  const jsonPath = writeJson(`webhooks-${date.replace(/[:.]/g, '-')}.json`, raw);
  writeJson('webhooks-latest.json', raw);
  if (!WRITE_RESULTS || !envelopes) {
    log(`wrote ${jsonPath} (RESULTS.md untouched: ${envelopes ? 'pass --write-results to rewrite its bench:webhooks section' : 'BENCH_SKIP_ENVELOPES has no envelope table to write'})`);
    return;
  }

  const envTable = envelopes.map((e) =>
    `| ${e.size} | ${e.count} | ${e.inline.p50_ms} / ${e.inline.p99_ms} | ${e.worker.p50_ms} / ${e.worker.p99_ms} | ${e.inline.main_thread_ms_per_envelope} | ${e.worker.main_thread_ms_per_envelope} | ${r1(e.inline.main_thread_ms_per_envelope / Math.max(e.worker.main_thread_ms_per_envelope, 0.01))}× | ${e.inline.per_envelope_ms} | ${e.worker.per_envelope_ms} |`);
  const delTable = [result.burstRow, result.steadyRow].map((d) =>
    `| ${d.run} | ${d.deliveries} of ${d.expected} | ${d.misrouted} | ${d.per_second} | ${d.p50_ms} | ${d.p99_ms} | ${d.poolgate_cpu_us_per_delivery} | ${d.receiver_cpu_us_per_delivery} | ${d.target} | ${d.met ? 'met' : 'not met'} |`);
  const f = (n) => (n === null || n === undefined ? '–' : String(n));
  const floorTable = floors.map((d) =>
    `| ${d.run} | ${d.deliveries} of ${d.expected} | ${d.failed} | ${d.per_second} | ${f(d.p50_ms)} | ${f(d.p99_ms)} | ${f(d.floor_cpu_us_per_delivery)} | ${f(d.receiver_cpu_us_per_delivery)} |`);
  const ratioTable = [result.burstRow, result.steadyRow].filter((d) => d.cpu_over_floor !== undefined).map((d) =>
    `| ${d.run} | ${f(d.cpu_over_floor)} | ≤ ${TARGET.cpu_over_floor}: ${d.cpu_over_floor_met ? 'met' : '**missed**'} | ${f(d.per_second_over_floor)} |`);
  m.loadavg_1m_end = Math.round(loadavg()[0] * 100) / 100;
  writeMarkedSection('webhooks', `\`npm run bench:webhooks\` (bench/webhooks.mjs). Two parts, each run side by side in one go.

${provenance(m, date, command)}${m.loadavg_1m > m.nproc * 0.5 ? `\n- the machine was not quiet (load average ${m.loadavg_1m} on ${m.nproc} CPUs at the start): a smoke run, not results` : ''}

**Envelope bodies: event-loop delay, inline vs piscina.** Envelopes of each size (an http result body with quotes and
non-ASCII text) serialised and SHA-256 hashed two at a time, inline (\`envelopeBodyInline\`) and in the piscina pool
(\`envelopeBodyInWorker\`, 2 threads), while \`perf_hooks.monitorEventLoopDelay\` (1 ms resolution) watches the loop
and \`performance.eventLoopUtilization\` counts the main thread's busy time. The busy time per envelope is the
steadier figure on a shared machine (delay percentiles also catch other processes and GC); the ratio is inline ÷ piscina.

| body | envelopes | inline loop delay p50 / p99 ms | piscina loop delay p50 / p99 ms | inline main-thread ms per envelope | piscina main-thread ms per envelope | ratio | inline wall ms per envelope | piscina wall ms per envelope |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
${envTable.join('\n')}

The outbox uses the pool for bodies of at least ${OFFLOAD_AT_BYTES / 1024} KiB (\`OFFLOAD_AT_BYTES\`) and makes smaller ones inline.

**Deliveries.** \`poolgate start\` on a fresh local PostgreSQL database (every role in one process; deliverer
\`webhookConcurrency\` ${settings.concurrency}, per-destination adaptive limit under the ceiling ${settings.per_destination_ceiling}),
${settings.destinations} destinations on one local https receiver in its own process (TLS, keep-alive, answers 200 at once).
Burst: ${settings.burst_events} events land in the outbox in one commit; deliveries/s from that commit to the last arrival.
Steady: job completions at a fixed rate, each enqueued with \`enqueueJobEvent\` in its own transaction; latency from
the enqueue's commit (the job's completion) to the arrival at the receiver. Every delivery is checked to have
reached its own destination's path; none may be missing. CPU µs per delivery: user + system time of the poolgate
process and of the receiver process over the run, divided by the requests received (steadier than rates on a
shared machine). Targets: issue 18.

| run | delivered | misrouted | deliveries/s | p50 ms | p99 ms | poolgate CPU µs/delivery | receiver CPU µs/delivery | target | |
|---|---:|---:|---:|---:|---:|---:|---:|---|---|
${delTable.join('\n')}
${floors.length ? `
**Against the floor (issue 28 item 5).** Right after each run above, in the same run on the same machine: undici alone
(bench/lib/webhook-floor.mjs) POSTing the same envelopes (\`envelopeBodyInline\`), each signed at send time with the
deliverer's \`signDelivery\` and headers, to the same receiver and destinations through one keep-alive Agent, with
the deliverer's in-flight limits (${settings.concurrency} in all, ${settings.per_destination_ceiling} per destination) and nothing else: no
outbox, claims, records or retries. The burst floor sends every delivery as fast as the limits allow; the steady floor
sends each event's deliveries at its scheduled time (latency from that time to the answer). Absolute rates do not
carry between machines; the ratio of CPU per delivery does. Target: poolgate CPU per delivery ≤ ${TARGET.cpu_over_floor}× the floor's.

| floor run | delivered | failed | deliveries/s | p50 ms | p99 ms | floor CPU µs/delivery | receiver CPU µs/delivery |
|---|---:|---:|---:|---:|---:|---:|---:|
${floorTable.join('\n')}

| run | poolgate CPU per delivery ÷ the floor's | target | poolgate deliveries/s ÷ the floor's |
|---|---:|---|---:|
${ratioTable.join('\n')}
` : ''}`, 'Webhook deliveries');
  log(`wrote ${jsonPath} and the bench:webhooks section of bench/RESULTS.md`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
