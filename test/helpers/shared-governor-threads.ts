// Drives worker threads attached to a shared-memory governor for the tests: spawning them, command/reply
// plumbing, shared counters, and polling for a condition.
import { Worker } from 'node:worker_threads';
import type { Test } from 'tap';
import type { SharedMemoryGovernor, SharedGovernorHandle } from '../../src/governor/shared-memory.js';
import type { Command, LoadPlan, WorkerInput } from './shared-governor-worker.js';

const WORKER = new URL('./shared-governor-worker.js', import.meta.url);

export interface Reply {
  id?: number;
  ok?: boolean;
  reason?: string;
  order?: number;
  ready?: boolean;
  released?: number;
  closed?: boolean;
  state?: { inFlight: number; queued: number };
}

export function spawn(handle: SharedGovernorHandle, mode: WorkerInput['mode'], shared: { holders: SharedArrayBuffer; checks: SharedArrayBuffer }, plan?: LoadPlan): Worker {
  const input: WorkerInput = { handle, mode, holders: shared.holders, checks: shared.checks, plan };
  return new Worker(WORKER, { workerData: input });
}

export function counters() {
  return { holders: new SharedArrayBuffer(64 * 4), checks: new SharedArrayBuffer(8 * 4) };
}

/** A worker driven by commands: send one, await the reply that matches. */
export class Driven {
  readonly worker: Worker;
  readonly #replies: Reply[] = [];
  #wake: (() => void) | null = null;

  constructor(worker: Worker) {
    this.worker = worker;
    worker.on('message', (m: Reply) => {
      this.#replies.push(m);
      this.#wake?.();
    });
  }

  send(c: Command): void {
    this.worker.postMessage(c);
  }

  async reply(match: (r: Reply) => boolean, ms = 60_000): Promise<Reply> {
    const deadline = Date.now() + ms;
    for (;;) {
      const i = this.#replies.findIndex(match);
      if (i >= 0) return this.#replies.splice(i, 1)[0]!;
      if (Date.now() > deadline) throw new Error(`no reply from the worker within ${ms / 1000} s (waiting for ${match.toString()})`);
      await new Promise<void>((r) => {
        this.#wake = r;
        setTimeout(r, 200);
      });
    }
  }
}

export async function driven(gov: SharedMemoryGovernor, t: Test, shared = counters()): Promise<Driven> {
  const handle = gov.handle();
  const d = new Driven(spawn(handle, 'commands', shared));
  t.teardown(async () => {
    await d.worker.terminate();
    gov.reclaim(handle);
  });
  // Starting a worker compiles its TypeScript: slow on a loaded machine.
  await d.reply((r) => r.ready === true, 90_000);
  return d;
}

