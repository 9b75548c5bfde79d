// Latency at a fixed request rate (open loop), in microseconds: closed-loop tools at N connections measure
// mostly the queue in front of a saturated server, so a proxy's own added latency is measured here at a
// rate every target sustains. undici Pool of `connections` keep-alive connections; requests are started on
// a 1 ms tick whatever the answers do, so a slow target builds a backlog that shows in its tail.
// Each latency counts from the request's scheduled start (t0 + i / rate), not from when the tick got round to
// sending it (wrk2's correction for coordinated omission, issue 29): a stall of the target, or of this
// process, that holds requests back is charged to every request that should have gone out during it.
// Debian has no wrk2 package; this is the generator for the paced rows.
import { writeFileSync } from 'node:fs';
import { Pool } from 'undici';

/**
 * @param {{ name: string, url: string, urls?: string[], headers?: Record<string,string>, rate: number, duration: number, connections: number }} spec
 */
export async function paced(spec) {
  // Several URLs (one port per data plane thread): the connections are split and requests take turns.
  const urls = (spec.urls ?? [spec.url]).map((x) => new URL(x));
  const u = urls[0];
  const perPool = Math.max(1, Math.round(spec.connections / urls.length));
  const pools = urls.map((x) => new Pool(x.origin, { connections: perPool, pipelining: 1, connect: { rejectUnauthorized: false } }));
  // Every connection is opened before the clock starts: as many requests at once as a pool has connections,
  // untimed. Otherwise the first requests pay the connection setup (a TLS handshake each for the https
  // origin measured directly), which is not the latency this measures and made the direct row's p99 ~10 ms.
  await Promise.all(
    pools.flatMap((pool) =>
      Array.from({ length: perPool }, () =>
        pool
          .request({ path: urls[0].pathname, method: 'GET', headers: spec.headers })
          .then((res) => res.body.dump())
          .catch(() => {}),
      ),
    ),
  );
  let turn = 0;
  const latencies = [];
  let errors = 0;
  let non2xx = 0;
  const inflight = new Set();
  const one = async (started) => {
    try {
      const pool = pools[turn++ % pools.length];
      const res = await pool.request({ path: u.pathname, method: 'GET', headers: spec.headers });
      await res.body.dump();
      if (res.statusCode < 200 || res.statusCode > 299) non2xx++;
      const latency = performance.now() - started;
      latencies.push(latency);
      series?.push([Math.round((started - t0) * 1000) / 1000, Math.round(latency * 1000) / 1000]);
    } catch {
      errors++;
    }
  };
  // BENCH_PACED_SERIES=<prefix>: every request's [start, latency] in ms, to <prefix>-<target>.json (is the tail
  // spread over the run, or a few stalls?).
  const series = process.env.BENCH_PACED_SERIES ? [] : null;
  const total = spec.rate * spec.duration;
  const t0 = performance.now();
  let sent = 0;
  await new Promise((resolve) => {
    const tick = () => {
      // Catch up to where the schedule says we should be (timers are late under load).
      const due = Math.min(total, Math.floor(((performance.now() - t0) / 1000) * spec.rate) + 1);
      while (sent < due) {
        // The request's place in the schedule, however late this tick runs.
        const p = one(t0 + (sent * 1000) / spec.rate);
        sent++;
        inflight.add(p);
        void p.finally(() => inflight.delete(p));
      }
      if (sent >= total) resolve();
      else setTimeout(tick, 1);
    };
    tick();
  });
  await Promise.all(inflight);
  await Promise.all(pools.map((p) => p.close()));
  if (series) writeFileSync(`${process.env.BENCH_PACED_SERIES}-${spec.name.replace(/\W+/g, '_')}.json`, JSON.stringify(series));
  latencies.sort((a, b) => a - b);
  const pct = (p) => (latencies.length ? Math.round(latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))] * 1000) / 1000 : null);
  return {
    name: spec.name,
    tool: `paced ${spec.rate}/s`,
    requests: latencies.length,
    rps: Math.round((latencies.length / ((performance.now() - t0) / 1000)) * 10) / 10,
    latency_ms: { p50: pct(50), p99: pct(99), p999: pct(99.9), max: pct(100) },
    latency_from: 'scheduled start',
    errors,
    non2xx,
    connections: spec.connections,
    duration_s: spec.duration,
  };
}
