// Issue 27's failover measurement: `dataplane` processes (the built binary) behind paced traffic, a Redis
// primary SIGKILLed under it, and what it cost: seconds until admissions resume, requests refused meanwhile
// (and with what), the origin's peak concurrency before, during and after, and leases left over. Shared by
// the short test (npm test) and the soak version.
import { once } from 'node:events';
import { createServer as createHttpsServer } from 'node:https';
import { readFileSync, rmSync } from 'node:fs';
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { until } from './until.js';
import { Pool } from 'undici';
import { fromRoot } from '../../src/config/paths.js';
import { binArgv, spawnListening } from './process.js';
import { selfSignedCert } from './origin.js';

export interface Node {
  child: ChildProcessWithoutNullStreams;
  proxy: number;
  /** Its /metrics and /readyz port. */
  metrics: number;
}

/** A node's master key: random-looking, since a patterned key is refused (issue 26 item 8). */
const NODE_SECRET_KEY = '65cac2973939490da978688cf7fa47c08054ccaae7cc913bef96c3348e1525b1';

/**
 * The environment of a `dataplane` node beside a test's control service: its store and data dir, every port free,
 * loopback origins trusted through `originCaFile`, no access log; `extra` adds the Redis target and the setting
 * under test.
 */
export function dataplaneNodeEnv(
  control: { config: { databaseUrl: string | null; dataDir: string } },
  originCaFile: string,
  extra: Record<string, string>,
): Record<string, string> {
  return {
    DATABASE_URL: control.config.databaseUrl!,
    POOLGATE_PROXY_PORT: '0',
    POOLGATE_METRICS_PORT: '0',
    POOLGATE_CONTROL_PORT: '0',
    POOLGATE_LOCK_PORT: '0',
    POOLGATE_PG_PORT: '0',
    POOLGATE_MYSQL_PORT: '0',
    POOLGATE_HOST: '127.0.0.1',
    POOLGATE_ALLOW_PRIVATE_TARGETS: 'true',
    POOLGATE_ORIGIN_CA_FILE: originCaFile,
    POOLGATE_ACCESS_LOG_SAMPLE: '0',
    POOLGATE_ACCESS_LOG_FILE: '/dev/null',
    POOLGATE_LOG_LEVEL: 'error',
    POOLGATE_SECRET_KEY: NODE_SECRET_KEY,
    POOLGATE_DATA_DIR: control.config.dataDir,
    ...extra,
  };
}

export async function startNode(env: Record<string, string>): Promise<Node> {
  const { child, listening } = await spawnListening(binArgv('dataplane'), {
    cwd: fromRoot(),
    env: { ...process.env, ...env },
    timeoutMs: 60_000,
    name: 'dataplane',
  });
  child.stdout.resume();
  return { child, proxy: listening.proxy as number, metrics: listening.metrics as number };
}

export async function stopNode(n: Node): Promise<void> {
  if (n.child.exitCode !== null || n.child.signalCode !== null) return;
  const exited = once(n.child, 'exit');
  n.child.kill('SIGTERM');
  const timer = setTimeout(() => n.child.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(timer);
}

/** An https origin per pool path: GET /<pool>/delay/<ms>; counts requests in progress (arrival → end) per pool. */
export async function countingOrigin() {
  const cert = selfSignedCert();
  const active = new Map<string, number>();
  /** Per pool: the peak since the last mark, and the peak of each marked phase. */
  const peaks = new Map<string, number>();
  const server = createHttpsServer({ key: readFileSync(cert.keyFile), cert: readFileSync(cert.certFile) }, (req, res) => {
    const m = /^\/([^/]+)\/delay\/(\d+)/.exec(req.url ?? '');
    const pool = m?.[1] ?? '-';
    const n = (active.get(pool) ?? 0) + 1;
    active.set(pool, n);
    peaks.set(pool, Math.max(peaks.get(pool) ?? 0, n));
    req.resume();
    setTimeout(() => {
      active.set(pool, active.get(pool)! - 1);
      res.end('ok');
    }, Number(m?.[2] ?? 0));
  });
  server.keepAliveTimeout = 60_000;
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    url: `https://127.0.0.1:${(server.address() as { port: number }).port}`,
    caFile: cert.certFile,
    /** The peak of `pool` since the last take (then starts again from what is in progress now). */
    takePeak(pool: string): number {
      const p = peaks.get(pool) ?? 0;
      peaks.set(pool, active.get(pool) ?? 0);
      return p;
    },
    async close() {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
      rmSync(cert.dir, { recursive: true, force: true });
    },
  };
}
export type CountingOrigin = Awaited<ReturnType<typeof countingOrigin>>;

export interface Sample {
  start: number;
  end: number;
  status: number;
  error: string | null;
}

/**
 * Paced traffic: one request every `paceMs` to `sub`, alternating over `nodes`, each holding the origin
 * `holdMs`, until stop() (which resolves once every request has its answer).
 */
export function pacedLoad(nodes: Node[] | string, sub: string, opts: { paceMs: number; holdMs: number; t0: number }) {
  const urls = typeof nodes === 'string' ? [nodes] : nodes.map((n) => `http://127.0.0.1:${n.proxy}`);
  const clients = urls.map((u) => new Pool(u, { connections: 64 }));
  const samples: Sample[] = [];
  const inflight = new Set<Promise<void>>();
  let i = 0;
  const one = async (node: number) => {
    const start = performance.now() - opts.t0;
    let status = 0;
    let error: string | null = null;
    try {
      const res = await clients[node]!.request({ path: `/${sub}/delay/${opts.holdMs}`, method: 'GET', headers: { host: `${sub}.pools.localhost` } });
      status = res.statusCode;
      const text = await res.body.text();
      if (status !== 200) {
        try {
          error = (JSON.parse(text) as { error?: string }).error ?? text.slice(0, 60);
        } catch {
          error = 'not poolgate'; // the balancer's own page (502 when a node died mid-request)
        }
      }
    } catch (err) {
      error = (err as Error).message;
    }
    samples.push({ start, end: performance.now() - opts.t0, status, error });
  };
  const timer = setInterval(() => {
    const p = one(i++ % clients.length);
    inflight.add(p);
    void p.finally(() => inflight.delete(p));
  }, opts.paceMs);
  return {
    samples,
    async stop() {
      clearInterval(timer);
      await Promise.all(inflight);
      await Promise.all(clients.map((c) => c.close()));
    },
  };
}

export interface FailoverFigures {
  requests: number;
  refused: number;
  /** Refusals by status and code, e.g. {"503 governor_unavailable": 12}. */
  refusedBy: Record<string, number>;
  /** From the kill until the answer of the last refused request (0 when nothing was refused), seconds. */
  refusingS: number;
  /** Median time a refused request waited for its answer, ms. */
  refusedP50Ms: number;
  /**
   * From the kill until the start of the first request admitted after the failover's last refusal (admissions
   * resumed), seconds. The failover's refusals: every 503, and any refusal of a request sent before Redis took
   * writes again. A 504 `queue_timeout` of a request sent after that is the overload's queue (the scenario sends more
   * than the pool serves), not the failover's: counting it, a run whose last requests waited out the queue had no
   * admission after them and read as never resumed.
   */
  resumeS: number;
}

/** What the samples say about a kill at `killAt`, with Redis taking writes again at `backAt` (ms on the load's clock). */
export function figures(samples: Sample[], killAt: number, backAt: number): FailoverFigures {
  const refusedSamples = samples.filter((s) => s.status !== 200);
  const refusedBy: Record<string, number> = {};
  for (const s of refusedSamples) refusedBy[`${s.status} ${s.error ?? ''}`.trim()] = (refusedBy[`${s.status} ${s.error ?? ''}`.trim()] ?? 0) + 1;
  const lastRefusal = refusedSamples.length ? Math.max(...refusedSamples.map((s) => s.end)) : killAt;
  const failoverRefused = refusedSamples.filter((s) => s.status === 503 || s.start < backAt);
  const lastRefusedStart = failoverRefused.length ? Math.max(...failoverRefused.map((s) => s.start)) : killAt;
  const firstOk = samples.filter((s) => s.status === 200 && s.start >= lastRefusedStart).sort((a, b) => a.start - b.start)[0];
  return {
    requests: samples.length,
    refused: refusedSamples.length,
    refusedBy,
    refusingS: Math.max(0, lastRefusal - killAt) / 1000,
    refusedP50Ms: refusedSamples.length ? Math.round(refusedSamples.map((s) => s.end - s.start).sort((a, b) => a - b)[Math.floor(refusedSamples.length / 2)]!) : 0,
    resumeS: firstOk ? Math.max(0, firstOk.start - killAt) / 1000 : NaN,
  };
}

/** `until` every 25 ms with errors counting as false; resolves with the time `cond` first held, or null at `ms`. */
export async function when(cond: () => Promise<boolean>, ms: number): Promise<number | null> {
  return until('a condition', async () => (await cond().catch(() => false)) && performance.now(), ms, 25).catch(() => null);
}
