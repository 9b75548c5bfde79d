// A worker thread for the shared-memory governor tests: attaches to the main thread's governor and either
// runs a randomized load (mode 'load') or acquires and releases on command (mode 'commands').
import { parentPort, workerData } from 'node:worker_threads';
import { SharedMemoryGovernor, type SharedGovernorHandle } from '../../src/governor/shared-memory.js';
import { abortableOf, type Outcome, type Permit } from '../../src/governor/governor.js';
import { seeded } from './governor-suite.js';
import { sleep } from './until.js';

export interface LoadPlan {
  /** Pools to pick from at random; `counter` indexes `holders`, `budgetCounter` (or -1) too. */
  pools: Array<{ poolId: number; limit: number; counter: number; budgetCounter: number; budgetLimit: number }>;
  ops: number;
  /** Acquires this worker keeps going at once. */
  concurrency: number;
  seed: number;
  maxWaitMs: number;
  maxHoldMs: number;
  /** Share of acquires aborted while they wait. */
  abortShare: number;
}

export interface WorkerInput {
  handle: SharedGovernorHandle;
  mode: 'load' | 'commands';
  /** Int32 counters of slots held right now (per pool, per budget), checked against the limits by every thread. */
  holders: SharedArrayBuffer;
  /** Int32: [0] limit violations seen, [1] grant order counter. */
  checks: SharedArrayBuffer;
  plan?: LoadPlan;
}

export interface LoadResult {
  admitted: number;
  refused: Record<string, number>;
}

/** A command from the test to a 'commands' worker. */
export type Command =
  | { cmd: 'acquire'; id: number; poolId: number; waitMs: number }
  | { cmd: 'release'; id: number; outcome?: Outcome }
  | { cmd: 'abort'; id: number }
  | { cmd: 'state'; poolId: number }
  | { cmd: 'close' };

const input = workerData as WorkerInput;
const gov = SharedMemoryGovernor.attach(input.handle);
const holders = new Int32Array(input.holders);
const checks = new Int32Array(input.checks);

async function load(plan: LoadPlan): Promise<LoadResult> {
  const rnd = seeded(plan.seed);
  const result: LoadResult = { admitted: 0, refused: {} };
  let next = 0;
  const one = async (): Promise<void> => {
    const p = plan.pools[Math.floor(rnd() * plan.pools.length)]!;
    const waitMs = rnd() < 0.2 ? 0 : Math.floor(rnd() * plan.maxWaitMs);
    const hold = Math.floor(rnd() * plan.maxHoldMs);
    const ac = rnd() < plan.abortShare ? new AbortController() : null;
    const abortAfter = Math.floor(rnd() * plan.maxWaitMs);
    const a = gov.acquire({ poolId: p.poolId, waitMs, abortable: ac ? abortableOf(ac.signal) : undefined });
    let timer: NodeJS.Timeout | undefined;
    if (ac !== null && a instanceof Promise) timer = setTimeout(() => ac.abort(), abortAfter);
    const got = await a;
    clearTimeout(timer);
    if (!got.ok) {
      result.refused[got.reason] = (result.refused[got.reason] ?? 0) + 1;
      return;
    }
    result.admitted++;
    // Counted after the admission and uncounted before the release: never more than the governor lets in.
    if (Atomics.add(holders, p.counter, 1) + 1 > p.limit) Atomics.add(checks, 0, 1);
    if (p.budgetCounter >= 0 && Atomics.add(holders, p.budgetCounter, 1) + 1 > p.budgetLimit) Atomics.add(checks, 0, 1);
    if (hold > 0) await sleep(hold);
    else await new Promise((r) => setImmediate(r));
    Atomics.sub(holders, p.counter, 1);
    if (p.budgetCounter >= 0) Atomics.sub(holders, p.budgetCounter, 1);
    got.permit.release({ status: 200, latencyMs: hold });
  };
  const lane = async (): Promise<void> => {
    while (next < plan.ops) {
      next++;
      await one();
    }
  };
  await Promise.all(Array.from({ length: plan.concurrency }, lane));
  return result;
}

function commands(): void {
  const permits = new Map<number, Permit>();
  const aborts = new Map<number, AbortController>();
  parentPort!.on('message', async (c: Command) => {
    switch (c.cmd) {
      case 'acquire': {
        const ac = new AbortController();
        aborts.set(c.id, ac);
        const a = await gov.acquire({ poolId: c.poolId, waitMs: c.waitMs, abortable: abortableOf(ac.signal) });
        // The grant order across threads: taken as the slot is settled here.
        const order = a.ok ? Atomics.add(checks, 1, 1) : -1;
        if (a.ok) permits.set(c.id, a.permit);
        parentPort!.postMessage({ id: c.id, ok: a.ok, reason: a.ok ? undefined : a.reason, queuedMs: a.queuedMs, order });
        break;
      }
      case 'release':
        permits.get(c.id)?.release(c.outcome);
        permits.delete(c.id);
        parentPort!.postMessage({ released: c.id });
        break;
      case 'abort':
        aborts.get(c.id)?.abort();
        break;
      case 'state':
        parentPort!.postMessage({ state: gov.state(c.poolId) });
        break;
      case 'close':
        await gov.close();
        parentPort!.postMessage({ closed: true });
        break;
    }
  });
  parentPort!.postMessage({ ready: true });
}

if (input.mode === 'load') {
  const result = await load(input.plan!);
  await gov.close();
  parentPort!.postMessage({ result });
} else {
  commands();
}
