// The deliveries floor (issue 28 item 5): undici POSTing the same signed bodies to the same receiver, nothing
// else — no outbox, claims, records or retries. Each body is the envelope poolgate's outbox makes
// (envelopeBodyInline), each POST signed at send time with the deliverer's own signDelivery and headers, sent
// through one undici Agent (keep-alive, no per-origin cap) with the deliverer's in-flight limits: `concurrency`
// in all, `perDestination` per destination. The bench measures this process's CPU per delivery beside
// poolgate's, in the same run on the same machine: the ratio carries between machines, absolute rates do not.
// Forked with IPC by bench/webhooks.mjs: argv caFile. Messages in: {prepare}, {go}; out: {ready}, {done}.
import { readFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { createSecureContext } from 'node:tls';
import { Agent } from 'undici';

const { envelopeBodyInline } = await import('../../dist/src/webhooks/envelope-body.js');
const { deliveryHeaders, signDelivery } = await import('../../dist/src/webhooks/signature.js');

const [caFile] = process.argv.slice(2);
const agent = new Agent({ connect: { secureContext: createSecureContext({ ca: readFileSync(caFile, 'utf8') }) }, keepAliveTimeout: 30_000 });
let job = null;

/**
 * prepare: { events, destinations: [{ id, url, secret }], concurrency, perDestination, eventType, pool, rate? }.
 * Bodies are made before the clock starts (poolgate's are made at enqueue and read from the outbox).
 */
async function prepare(p) {
  const makeEvent = (prefix) => {
    const jobId = `${prefix}_${randomBytes(8).toString('hex')}`;
    const body = envelopeBodyInline({
      jobId, poolId: p.pool.id, poolHost: p.pool.host, status: 'completed', reason: 'busy', createdAt: Date.now(), completedAt: Date.now(),
      detail: { kind: 'http', status: 200, headers: { 'content-type': 'application/json' }, body: '{"result":"ok"}' },
    });
    return { jobId, bytes: Buffer.from(body.bytes), sha256: body.sha256 };
  };
  // Job ids start with the run's tag, so the bench counts this run's arrivals apart from any other.
  const events = Array.from({ length: p.events }, () => makeEvent(p.tag));
  job = { ...p, events };
  // Warm connections, as the deliverer's are after its warm-up: as many POSTs at once per destination as it
  // may have in flight, untimed (otherwise the floor would pay a TLS handshake per connection in its figures).
  const lanesPer = Math.max(1, Math.min(p.perDestination, Math.floor(p.concurrency / p.destinations.length)));
  await Promise.all(
    p.destinations.flatMap((d) => {
      const u = new URL(d.url);
      return Array.from({ length: lanesPer }, () => post({ ...d, origin: u.origin, path: u.pathname }, makeEvent('floorwarm')).catch(() => {}));
    }),
  );
}

async function post(dest, e) {
  const timestamp = Math.floor(Date.now() / 1000);
  const headers = {
    'content-type': 'application/json',
    'user-agent': 'poolgate-webhooks/1',
    ...deliveryHeaders({ signature: signDelivery(dest.secret, timestamp, e.jobId, { sha256: e.sha256 }), timestamp, jobId: e.jobId, webhookId: dest.id, event: job.eventType }),
  };
  const res = await agent.request({ origin: dest.origin, path: dest.path, method: 'POST', headers, body: e.bytes });
  await res.body.dump();
  return res.statusCode;
}

/** Every (event, destination) pair, as fast as the limits allow (burst) or on a schedule of `rate` events/s (steady). */
async function go() {
  const dests = job.destinations.map((d) => {
    const u = new URL(d.url);
    return { ...d, origin: u.origin, path: u.pathname };
  });
  const lanesPer = Math.max(1, Math.min(job.perDestination, Math.floor(job.concurrency / dests.length)));
  let failed = 0;
  const t0 = performance.now();
  const latencies = [];
  await Promise.all(
    dests.map(async (dest) => {
      let next = 0;
      const lane = async () => {
        while (next < job.events.length) {
          const i = next++;
          // Steady: an event is not sent before its scheduled time; its latency counts from that time.
          const due = job.rate ? t0 + (i * 1000) / job.rate : t0;
          const wait = due - performance.now();
          if (wait > 1) await new Promise((r) => setTimeout(r, wait));
          try {
            const status = await post(dest, job.events[i]);
            if (status < 200 || status > 299) failed++;
          } catch {
            failed++;
          }
          if (job.rate) latencies.push(performance.now() - due);
        }
      };
      await Promise.all(Array.from({ length: lanesPer }, lane));
    }),
  );
  const elapsed = performance.now() - t0;
  latencies.sort((a, b) => a - b);
  const pct = (p) => (latencies.length ? Math.round(latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))] * 10) / 10 : null);
  return { deliveries: job.events.length * dests.length, failed, elapsed_ms: Math.round(elapsed), p50_ms: pct(50), p99_ms: pct(99) };
}

process.on('message', (m) => {
  if (m.prepare) {
    void prepare(m.prepare).then(() => process.send({ ready: true }), (err) => process.send({ error: String(err?.stack ?? err) }));
  } else if (m.go) {
    void go().then((r) => process.send({ done: r }), (err) => process.send({ error: String(err?.stack ?? err) }));
  } else if (m === 'stop') {
    void agent.close().then(() => process.exit(0));
  }
});
process.send({ started: true });
