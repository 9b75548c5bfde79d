// Webhook deliveries benchmark. Two parts, each run side by side in one go:
//  1. Envelope bodies: event-loop delay (perf_hooks.monitorEventLoopDelay) while large envelopes are
//     serialised and hashed inline versus in the piscina worker pool (src/webhooks/envelope-body.ts).
//  2. Deliveries: the real `poolgate start` on a fresh PostgreSQL database, a local https receiver, job events
//     enqueued from this process with enqueueJobEvent (as the jobs runner does); deliveries per second in a
//     burst, and enqueue (job completion) → arrival latency p50/p99 at a steady rate.
// Usage: npm run bench:webhooks  (env BENCH_EVENTS burst events, default 500; BENCH_RATE steady events/s,
// default 50; BENCH_STEADY_S, default 5; POOLGATE_TEST_PG_URL). Writes bench/out/webhooks-*.json and the
// "## Webhook deliveries" section of bench/RESULTS.md.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import pg from 'pg';
import { api, startPoolgate } from './lib/poolgate.mjs';
import { machine, writeJson, writeSection } from './lib/results.mjs';

const { enqueueJobEvent } = await import('../dist/src/webhooks/outbox.js');
const { envelopeBodyInline, envelopeBodyInWorker, closeEnvelopeWorkers, OFFLOAD_AT_BYTES } = await import('../dist/src/webhooks/envelope-body.js');

function intEnv(name, def, min) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return def;
  if (!/^\d+$/.test(raw) || Number(raw) < min) throw new Error(`${name} must be an integer ≥ ${min}, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

const settings = {
  burst_events: intEnv('BENCH_EVENTS', 500, 1),
  destinations: 4,
  steady_rate: intEnv('BENCH_RATE', 50, 1),
  steady_s: intEnv('BENCH_STEADY_S', 5, 1),
  concurrency: 32,
  store: 'postgresql (local, fresh database)',
};
const PG_URL = process.env.POOLGATE_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const log = (msg) => process.stderr.write(`bench:webhooks: ${msg}\n`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pct = (sorted, p) => (sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] : NaN);
const r1 = (x) => Math.round(x * 10) / 10;

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

/** An https receiver that answers 200 and notes when each job id arrived (first arrival). */
async function startReceiver(cert) {
  const arrivals = new Map();
  let count = 0;
  const server = createServer({ key: readFileSync(cert.keyFile), cert: readFileSync(cert.certFile) }, (req, res) => {
    req.resume();
    req.on('end', () => {
      count++;
      const key = `${req.headers['x-service-job-id']}|${req.headers['x-service-webhook-id']}`;
      if (!arrivals.has(key)) arrivals.set(key, performance.timeOrigin + performance.now());
      res.writeHead(200, { 'content-length': '2' }).end('ok');
    });
  });
  server.keepAliveTimeout = 60_000;
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { url: `https://127.0.0.1:${server.address().port}`, arrivals, get count() { return count; }, close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }) };
}

async function main() {
  const m = machine();
  const envelopes = await envelopeBench();

  const dbName = `poolgate_bench_${randomBytes(4).toString('hex')}`;
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${dbName}`);
  await admin.end();
  const dbUrl = new URL(PG_URL);
  dbUrl.pathname = `/${dbName}`;
  const cert = selfSigned();
  const receiver = await startReceiver(cert);
  const svc = await startPoolgate({
    DATABASE_URL: dbUrl.toString(),
    POOLGATE_ALLOW_PRIVATE_TARGETS: 'true',
    POOLGATE_WEBHOOK_CA_FILE: cert.certFile,
    POOLGATE_WEBHOOK_CONCURRENCY: String(settings.concurrency),
    POOLGATE_LOG_LEVEL: 'warn',
  });
  const db = new pg.Pool({ connectionString: dbUrl.toString(), max: 8 });
  let result;
  try {
    const boot = await svc.admin(['bootstrap', '--team', 'Bench', '--email', 'bench@bench.test', '--plan', 'business']);
    const { rows } = await db.query(
      `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, async_enabled)
       VALUES ($1, 'bench', 'bench', 'http', 'https://api.example.test', 'api.example.test', true) RETURNING id`,
      [boot.team.id],
    );
    const pool = { id: rows[0].id, host: 'bench.pools.localhost' };
    for (let i = 0; i < settings.destinations; i++) {
      const res = await api(svc.controlUrl, boot.token, 'POST', '/api/v1/webhooks', { name: `dest-${i}`, url: `${receiver.url}/d${i}`, pool_ids: [pool.id] });
      if (res.status !== 201) throw new Error(`create webhook: ${res.status} ${JSON.stringify(res.body)}`);
    }
    const enqueuedAt = new Map();
    const enqueueOne = async () => {
      const jobId = `job_${randomBytes(8).toString('hex')}`;
      const c = await db.connect();
      try {
        await c.query('BEGIN');
        const tx = { query: async (text, params) => { const r = await c.query(text, params); return { rows: r.rows, rowCount: r.rowCount ?? 0 }; } };
        await enqueueJobEvent(tx, { jobId, poolId: pool.id, poolHost: pool.host, status: 'completed', reason: 'busy', createdAt: Date.now(), completedAt: Date.now(),
          detail: { kind: 'http', status: 200, headers: { 'content-type': 'application/json' }, body: '{"result":"ok"}' } });
        await c.query('COMMIT');
        enqueuedAt.set(jobId, performance.timeOrigin + performance.now());
      } finally {
        c.release();
      }
      return jobId;
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

    // Warm-up: connections and the deliverer's first claims.
    const warm = new Set();
    for (let i = 0; i < 20; i++) warm.add(await enqueueOne());
    await waitDelivered(warm, 30_000);

    // Burst: every event enqueued as fast as 8 connections allow; deliveries/s over first enqueue → last arrival.
    const burst = new Set();
    const t0 = performance.timeOrigin + performance.now();
    let left = settings.burst_events;
    await Promise.all(Array.from({ length: 8 }, async () => {
      while (left-- > 0) burst.add(await enqueueOne());
    }));
    const burstLat = await waitDelivered(burst, 120_000);
    const lastArrival = Math.max(...[...receiver.arrivals].filter(([k]) => burst.has(k.split('|')[0])).map(([, at]) => at));
    const burstRow = {
      run: `burst: ${settings.burst_events} events × ${settings.destinations} destinations`,
      deliveries: burstLat.length,
      expected: burst.size * settings.destinations,
      per_second: r1(burstLat.length / ((lastArrival - t0) / 1000)),
      p50_ms: r1(pct(burstLat, 50)),
      p99_ms: r1(pct(burstLat, 99)),
    };
    log(JSON.stringify(burstRow));

    // Steady: a fixed rate well under capacity; the latency a receiver sees from job completion.
    const steady = new Set();
    const steadyStart = performance.now();
    const total = settings.steady_rate * settings.steady_s;
    for (let i = 0; i < total; i++) {
      const due = steadyStart + (i * 1000) / settings.steady_rate;
      const wait = due - performance.now();
      if (wait > 0) await sleep(wait);
      void enqueueOne().then((id) => steady.add(id));
    }
    await sleep(200);
    const steadyLat = await waitDelivered(steady, 60_000);
    const steadyRow = {
      run: `steady: ${settings.steady_rate} events/s × ${settings.destinations} destinations for ${settings.steady_s} s`,
      deliveries: steadyLat.length,
      expected: steady.size * settings.destinations,
      per_second: r1(steadyLat.length / settings.steady_s),
      p50_ms: r1(pct(steadyLat, 50)),
      p99_ms: r1(pct(steadyLat, 99)),
    };
    log(JSON.stringify(steadyRow));
    result = { burstRow, steadyRow, receiverRequests: receiver.count };
  } finally {
    await db.end();
    await svc.stop();
    await receiver.close();
    rmSync(cert.dir, { recursive: true, force: true });
    const c = new pg.Client({ connectionString: PG_URL });
    await c.connect();
    await c.query(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
    await c.end();
  }

  const date = new Date().toISOString();
  const raw = { date, machine: m, settings, offload_at_bytes: OFFLOAD_AT_BYTES, envelopes, deliveries: [result.burstRow, result.steadyRow] };
  writeJson(`webhooks-${date.replace(/[:.]/g, '-')}.json`, raw);
  writeJson('webhooks-latest.json', raw);

  const envTable = envelopes.map((e) =>
    `| ${e.size} | ${e.count} | ${e.inline.p50_ms} / ${e.inline.p99_ms} | ${e.worker.p50_ms} / ${e.worker.p99_ms} | ${e.inline.main_thread_ms_per_envelope} | ${e.worker.main_thread_ms_per_envelope} | ${r1(e.inline.main_thread_ms_per_envelope / Math.max(e.worker.main_thread_ms_per_envelope, 0.01))}× | ${e.inline.per_envelope_ms} | ${e.worker.per_envelope_ms} |`);
  const delTable = [result.burstRow, result.steadyRow].map((d) => `| ${d.run} | ${d.deliveries} of ${d.expected} | ${d.per_second} | ${d.p50_ms} | ${d.p99_ms} |`);
  writeSection('## Webhook deliveries', `\`npm run bench:webhooks\` (bench/webhooks.mjs). Two parts, each run side by side in one go.

- date: ${date.slice(0, 16).replace('T', ' ')} UTC
- machine: ${m.nproc} CPUs (${m.cpu}), ${m.memory_gib} GiB, ${m.platform}, Node.js ${m.node}; load average ${m.loadavg_1m} at the start (the machine is shared)

**Envelope bodies: event-loop delay, inline vs piscina.** Envelopes of each size (an http result body with quotes and
non-ASCII text) serialised and SHA-256 hashed two at a time, inline (\`envelopeBodyInline\`) and in the piscina pool
(\`envelopeBodyInWorker\`, 2 threads), while \`perf_hooks.monitorEventLoopDelay\` (1 ms resolution) watches the loop
and \`performance.eventLoopUtilization\` counts the main thread's busy time. The busy time per envelope is the
steadier figure on a shared machine (delay percentiles also catch other processes and GC); the ratio is inline ÷ piscina.

| body | envelopes | inline loop delay p50 / p99 ms | piscina loop delay p50 / p99 ms | inline main-thread ms per envelope | piscina main-thread ms per envelope | ratio | inline wall ms per envelope | piscina wall ms per envelope |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
${envTable.join('\n')}

The outbox uses the pool for bodies of at least ${OFFLOAD_AT_BYTES / 1024} KiB (\`OFFLOAD_AT_BYTES\`) and makes smaller ones inline.

**Deliveries.** \`poolgate start\` on a fresh local PostgreSQL database (every role in one process, deliverer
concurrency ${settings.concurrency}, at most 4 per destination), ${settings.destinations} destinations on one local https receiver (TLS, keep-alive,
answers 200 at once), job events enqueued from the benchmark process with \`enqueueJobEvent\` in their own transaction.
Latency is from the enqueue transaction's commit (the job's completion) to the request's arrival at the receiver.

| run | delivered | deliveries/s | p50 ms | p99 ms |
|---|---:|---:|---:|---:|
${delTable.join('\n')}

In the burst every event is enqueued within a second or two, so its latency is mostly time spent waiting in the outbox
behind earlier deliveries (the queue drains at the deliveries/s shown); the steady run shows the latency of an
outbox that keeps up. Each delivery is one claim statement, one TLS POST and one statement recording the success.
`);
  log('wrote bench/RESULTS.md');
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
