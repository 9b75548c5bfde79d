// A discrete-event simulation of clients, the MemoryGovernor and an upstream with a true concurrency
// capacity and a true RPM limit: simulated time (no sleeping), a seeded random, deterministic results.
import type { Admission, Outcome, Permit } from '../../src/governor/governor.js';
import { MemoryGovernor, type GovernorTimers } from '../../src/governor/memory.js';
import { seeded } from './governor-suite.js';
import { Worker } from 'node:worker_threads';

/** Timers and a clock over simulated time: a binary heap of events ordered by (time, insertion). */
export class SimClock implements GovernorTimers {
  now = 0;
  #seq = 0;
  #heap: Array<{ t: number; seq: number; fn: (arg: never) => void; arg: unknown; cancelled: boolean }> = [];

  setTimeout<T>(fn: (arg: T) => void, ms: number, arg: T): unknown {
    const ev = { t: this.now + Math.max(0, ms), seq: this.#seq++, fn: fn as (arg: never) => void, arg, cancelled: false };
    const h = this.#heap;
    h.push(ev);
    for (let i = h.length - 1; i > 0; ) {
      const up = (i - 1) >> 1;
      if (!before(h[i]!, h[up]!)) break;
      [h[i], h[up]] = [h[up]!, h[i]!];
      i = up;
    }
    return ev;
  }

  clearTimeout(handle: unknown): void {
    if (handle) (handle as { cancelled: boolean }).cancelled = true;
  }

  /** Runs events up to `until`; between events, lets promise reactions (waiters admitted) run. */
  async run(until: number, settle: () => Promise<void>): Promise<void> {
    const h = this.#heap;
    while (h.length > 0 && h[0]!.t <= until) {
      const ev = h[0]!;
      const last = h.pop()!;
      if (h.length > 0) {
        h[0] = last;
        for (let i = 0; ; ) {
          const l = 2 * i + 1;
          const r = l + 1;
          let m = i;
          if (l < h.length && before(h[l]!, h[m]!)) m = l;
          if (r < h.length && before(h[r]!, h[m]!)) m = r;
          if (m === i) break;
          [h[i], h[m]] = [h[m]!, h[i]!];
          i = m;
        }
      }
      if (ev.cancelled) continue;
      this.now = ev.t;
      (ev.fn as (arg: unknown) => void)(ev.arg);
      await settle();
    }
    this.now = until;
  }
}

function before(a: { t: number; seq: number }, b: { t: number; seq: number }): boolean {
  return a.t < b.t || (a.t === b.t && a.seq < b.seq);
}

export interface UpstreamModel {
  /** True concurrency capacity: beyond it latency grows in proportion to in-flight. */
  capacity: number;
  /** In-flight beyond which the upstream answers 429 at once (overload shedding). */
  hardLimit: number;
  /** Unloaded latency, ms, and its relative jitter (uniform ±jitter/2). */
  baseMs: number;
  jitter: number;
  /** True requests per minute, counted in fixed minute windows; Infinity for none. */
  rpm: number;
  /** The capacity changes to `capacity` (and the hard limit in proportion) at `atMs`. */
  change?: { atMs: number; capacity: number };
}

export interface SimOptions {
  upstream: UpstreamModel;
  clients: number;
  durationMs: number;
  /** The pool's max_concurrent and adaptive floor. */
  maxConcurrent: number;
  adaptiveMin?: number;
  rpmOverride?: number | null;
  seed?: number;
  /** Sampling period of the curve, ms. */
  sampleEveryMs?: number;
}

export interface CurvePoint {
  tMs: number;
  limit: number;
  learnedRpm: number | null;
  shortRtt: number;
  longRtt: number;
  inFlight: number;
  /** Upstream 2xx answers and 429s during the period before this point. */
  ok: number;
  throttled: number;
}

export interface SimResult {
  curve: CurvePoint[];
  /** Totals over the whole run. */
  upstreamOk: number;
  upstreamThrottled: number;
  refusals: Record<string, number>;
}

const POOL = 1;

/**
 * Runs the model: `clients` closed-loop clients each acquire a slot (waiting up to 30 s), call the
 * upstream, release with what it said (status, latency, 429 count, retry hint, rate-limit headers),
 * think 0–10 ms and go again; a refused client waits its Retry-After.
 */
export async function simulate(o: SimOptions): Promise<SimResult> {
  const clock = new SimClock();
  const random = seeded(o.seed ?? 42);
  const gov = new MemoryGovernor({ now: () => clock.now, wallClock: () => 1_700_000_000_000 + clock.now, timers: clock });
  gov.configure(
    [
      {
        poolId: POOL,
        maxConcurrent: o.maxConcurrent,
        queueLength: 10_000,
        queueTimeoutMs: 30_000,
        budgetId: null,
        reservedConcurrent: 0,
        adaptive: true,
        adaptiveMin: o.adaptiveMin ?? 1,
        rpmOverride: o.rpmOverride ?? null,
      },
    ],
    [],
  );
  const up = { ...o.upstream };
  let upstreamInFlight = 0;
  let windowStart = 0;
  let windowCount = 0;
  let periodOk = 0;
  let periodThrottled = 0;
  const result: SimResult = { curve: [], upstreamOk: 0, upstreamThrottled: 0, refusals: {} };

  // Promise reactions of admitted waiters must run at the simulated instant they were admitted.
  let reactions = 0;
  const settle = async (): Promise<void> => {
    for (;;) {
      const before = reactions;
      await null;
      if (reactions === before) return;
    }
  };

  const rateHeaders = (now: number, remaining: number): Record<string, string> => {
    const resetS = Math.max(0, Math.ceil((windowStart + 60_000 - now) / 1000));
    return {
      'x-ratelimit-limit-requests': String(up.rpm),
      'x-ratelimit-remaining-requests': String(Math.max(0, remaining)),
      'x-ratelimit-reset-requests': `${resetS}s`,
    };
  };

  /** The upstream answers one request; `done` is called at the simulated time of its answer. */
  const call = (permit: Permit): void => {
    const now = clock.now;
    if (up.change !== undefined && now >= up.change.atMs) {
      up.hardLimit = Math.ceil((up.hardLimit * up.change.capacity) / up.capacity);
      up.capacity = up.change.capacity;
      up.change = undefined;
    }
    if (now - windowStart >= 60_000) {
      windowStart = now - ((now - windowStart) % 60_000);
      windowCount = 0;
    }
    upstreamInFlight++;
    let outcome: Outcome;
    let latency: number;
    if (upstreamInFlight > up.hardLimit) {
      latency = 2;
      outcome = { status: 429, throttled: 1, retryAfterMs: 1000, latencyMs: latency };
    } else if (Number.isFinite(up.rpm) && windowCount >= up.rpm) {
      latency = 2;
      const headers = { ...rateHeaders(now, 0), 'retry-after': String(Math.ceil((windowStart + 60_000 - now) / 1000)) };
      outcome = { status: 429, throttled: 1, latencyMs: latency, headers };
    } else {
      windowCount++;
      latency = up.baseMs * Math.max(1, upstreamInFlight / up.capacity) * (1 + up.jitter * (random() - 0.5));
      outcome = { status: 200, latencyMs: latency, headers: Number.isFinite(up.rpm) ? rateHeaders(now, up.rpm - windowCount) : {} };
    }
    clock.setTimeout(
      (p: Permit) => {
        upstreamInFlight--;
        if (outcome.status === 200) {
          result.upstreamOk++;
          periodOk++;
        } else {
          result.upstreamThrottled++;
          periodThrottled++;
        }
        p.release(outcome);
        clock.setTimeout(request, random() * 10, null);
      },
      latency,
      permit,
    );
  };

  const onAdmission = (a: Admission): void => {
    if (a.ok) {
      call(a.permit);
      return;
    }
    result.refusals[a.reason] = (result.refusals[a.reason] ?? 0) + 1;
    clock.setTimeout(request, a.retryAfterMs ?? 1000, null);
  };

  const onWaited = (a: Admission): void => {
    reactions++;
    onAdmission(a);
  };

  function request(): void {
    const a = gov.acquire({ poolId: POOL, waitMs: 30_000 });
    if (a instanceof Promise) a.then(onWaited, () => {});
    else onAdmission(a);
  }

  for (let i = 0; i < o.clients; i++) clock.setTimeout(request, random() * 100, null);
  const every = o.sampleEveryMs ?? 1000;
  const sample = (): void => {
    const s = gov.state(POOL);
    const l = gov.learned(POOL)!;
    result.curve.push({ tMs: clock.now, limit: l.adaptiveLimit ?? s.effectiveLimit, learnedRpm: l.learnedRpm, shortRtt: l.shortRttMs, longRtt: l.longRttMs, inFlight: s.inFlight, ok: periodOk, throttled: periodThrottled });
    periodOk = 0;
    periodThrottled = 0;
    clock.setTimeout(sample, every, null);
  };
  clock.setTimeout(sample, every, null);
  await clock.run(o.durationMs, settle);
  await gov.close();
  await settle();
  return result;
}

/**
 * simulate() in a worker thread of its own. A tap test process tracks every promise it creates (tap's
 * async-hook-domain, which ties an error to its test), and the simulation makes several per simulated request:
 * under tap one 240 s run took 2.1 s of CPU, 0.6 s in a thread without those hooks (2026-11-28). The
 * simulation is the same code either way, with the same seed and the same result.
 */
export function simulateApart(o: SimOptions): Promise<SimResult> {
  const worker = new Worker(new URL('./adaptive-sim-worker.js', import.meta.url), { workerData: o });
  return new Promise((resolve, reject) => {
    worker.once('message', (r: SimResult) => resolve(r));
    worker.once('error', reject);
    worker.once('exit', (code) => reject(new Error(`the simulation's worker exited (${code}) without a result`)));
  });
}

/** Figures over the curve between `fromMs` and `toMs` (after warm-up). */
export function summarize(r: SimResult, fromMs: number, toMs = Infinity, periodMs = 1000) {
  const pts = r.curve.filter((p) => p.tMs > fromMs && p.tMs <= toMs);
  const ok = pts.reduce((s, p) => s + p.ok, 0);
  const throttled = pts.reduce((s, p) => s + p.throttled, 0);
  const limits = pts.map((p) => p.limit);
  return {
    meanLimit: limits.reduce((s, l) => s + l, 0) / Math.max(1, limits.length),
    minLimit: Math.min(...limits),
    maxLimit: Math.max(...limits),
    learnedRpm: pts.at(-1)?.learnedRpm ?? null,
    okPerSecond: ok / ((pts.length * periodMs) / 1000),
    throttledShare: throttled / Math.max(1, ok + throttled),
  };
}
