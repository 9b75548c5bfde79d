// A data plane worker thread: the full pool listener (src/dataplane/server.ts) on the port it is told,
// on the snapshot the main thread pushes and the governor the main thread shares through shared memory.
// What needs the store or is process-wide goes back to the main thread: job inserts, nonce claims, metrics counts.
import { parentPort, workerData } from 'node:worker_threads';
import { SharedMemoryGovernor } from '../../governor/shared-memory.js';
import { PROCESS_TIME } from '../../governor/clock.js';
import type { JobIntake } from '../../jobs/job-intake.js';
import type { NonceStore } from '../../policies/nonce-store.js';
import { createLogger } from '../../log.js';
import { Dataplane } from '../server.js';
import type { FromWorker, ToWorker, WorkerStart } from './messages.js';
import { PushedSnapshots } from './pushed-snapshots.js';
import { RecordBatch } from './record-batch.js';
import { holdTickShape } from '../../runtime/tick-shape.js';

// This isolate's own nextTick feedback (src/runtime/tick-shape.ts), before its first request.
holdTickShape();
const start = workerData as WorkerStart;
const port = parentPort!;
const post = (m: FromWorker) => port.postMessage(m);
const log = createLogger(start.config.logLevel);
const feed = new PushedSnapshots(start.snapshot);
const batch = new RecordBatch(post);
const governor = SharedMemoryGovernor.attach(start.governor, PROCESS_TIME);

// Questions for the main thread, by id: job inserts (the store lives there) and nonce claims.
let nextAsk = 1;
const asked = new Map<number, (answer: ToWorker) => void>();
function ask(m: (id: number) => FromWorker): Promise<ToWorker> {
  return new Promise((resolve) => {
    const id = nextAsk++;
    asked.set(id, resolve);
    post(m(id));
  });
}

// Each job answer brings the poll address (the lock API's port is known only after the threads start).
let lockApiUrl = start.lockApiUrl;
const intake: JobIntake = {
  spill: async (job) => {
    const a = await ask((id) => ({ t: 'spill', id, job }));
    if (a.t !== 'spilled' || !a.ok) throw new Error('the main thread could not store the job');
  },
  log,
  lockApiUrl: () => lockApiUrl,
};
const nonces: NonceStore = {
  claim: async (nonce, ttlMs) => {
    const a = await ask((id) => ({ t: 'nonce', id, nonce, ttlMs }));
    return a.t === 'nonced' ? a.claim : 'full';
  },
  close: () => Promise.resolve(),
};

let dp: Dataplane | null = null;
let closing = false;

async function close(): Promise<void> {
  if (closing) return;
  closing = true;
  await dp?.close();
  batch.flush();
  await governor.close();
  post({ t: 'closed' });
  port.close();
}

// A fault that escaped every handler ends this thread, never the process: it stops taking connections, lets
// the requests in flight finish (up to drainMs: ending a uWS thread under them would abort the process), and
// exits with 1; the main thread replaces it.
function crashed(err: unknown): void {
  log.error({ err }, 'data plane thread: uncaught error; closing this thread (it will be replaced)');
  close().then(
    () => process.exit(1),
    () => process.exit(1),
  );
}
process.on('uncaughtException', crashed);
process.on('unhandledRejection', crashed);

// Listening before the data plane starts: pushes that arrive meanwhile apply in order to the first copy.
port.on('message', (m: ToWorker) => {
  if (m.t === 'snapshot') feed.loaded(m.snapshot);
  else if (m.t === 'keys') feed.keys(m.changes);
  else if (m.t === 'spilled' || m.t === 'nonced') {
    if (m.t === 'spilled') lockApiUrl = m.lockApiUrl;
    asked.get(m.id)?.(m);
    asked.delete(m.id);
  } else if (m.t === 'crash') {
    setImmediate(() => {
      throw new Error('crash requested by the main thread');
    });
  } else if (m.t === 'close') {
    close().catch((err: unknown) => {
      log.error({ err }, 'data plane thread close failed');
      process.exit(1);
    });
  }
});

try {
  dp = await Dataplane.start({
    config: start.config,
    log,
    governor,
    metrics: batch,
    jobs: intake,
    nonces,
    feed: (onLoad) => {
      feed.onLoad = onLoad;
      return feed;
    },
    port: start.port,
    drainMs: start.drainMs,
  });
  post({ t: 'listening', port: dp.port });
} catch (err) {
  post({ t: 'failed', message: (err as Error).message });
  await governor.close();
  port.close();
}
