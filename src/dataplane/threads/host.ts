// The multi-threaded data plane host (dataplaneThreads above 1): N worker threads each run the pool
// listener; the main thread keeps the store, the snapshot source and the authoritative shared governor,
// pushes every snapshot and key update to the threads, stores their async jobs and counts their requests.
import { createServer as createNetServer } from 'node:net';
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import type { Config } from '../../config/schema.js';
import type { JobIntake } from '../../jobs/job-intake.js';
import type { NonceStore } from '../../policies/nonce-store.js';
import type { Logger } from '../../log.js';
import type { DataplaneMetrics, RequestRecord } from '../../pool-request/release.js';
import type { Dataplane } from '../server.js';
import type { SharedGovernorHandle, SharedMemoryGovernor } from '../../governor/shared-memory.js';
import type { FromWorker, ToWorker, WorkerStart } from './messages.js';
import { proxyHttpParser, UWS_LIMITS } from '../http-parser.js';
import { unpackRecords } from './record-codec.js';

/** How many pool listener threads the config asks for (0: one per CPU). */
export function dataplaneThreadCount(config: Pick<Config, 'dataplaneThreads'>): number {
  return config.dataplaneThreads === 0 ? availableParallelism() : config.dataplaneThreads;
}

export interface DataplaneThreadsOptions {
  config: Config;
  log: Logger;
  threads: number;
  /** The main thread's data plane (not listening): its snapshot source feeds the threads. */
  dataplane: Dataplane;
  /** The governor the main thread configures; each thread attaches its own handle(). */
  governor: SharedMemoryGovernor;
  /** Where the threads' finished requests are counted (the main thread's Prometheus and rollups). */
  metrics: DataplaneMetrics;
  /** Stores the threads' async jobs. */
  jobs: JobIntake;
  /** The one HMAC nonce store of the process (the main data plane's), where the threads claim theirs. */
  nonces: NonceStore;
  drainMs?: number;
}

const SHARED_PORT_HELP = 'the data plane threads cannot all listen on one port: set dataplaneThreadPorts=each (one port per thread, behind a balancer) or dataplaneThreads=1';

/**
 * A free port for the shared listener: every thread must bind the same port with SO_REUSEPORT, so a port-0 bind
 * by each would give each its own. This finds one (bind 0, read, close); a race for it is retried by start().
 */
function freePort(host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createNetServer();
    probe.once('error', reject);
    probe.listen(0, host, () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
}

/** One worker thread and what the host knows of it. */
class Thread {
  readonly worker: Worker;
  readonly governor: SharedGovernorHandle;
  readonly ended: Promise<void>;
  port = 0;
  served = 0;
  /** Stopped on purpose (a failed shared start), not crashed. */
  stopped = false;
  readonly startedAt = Date.now();

  /** Where this thread's finished requests are counted (the host's metrics sink). */
  readonly #record: (r: RequestRecord) => void;

  constructor(start: WorkerStart, host: DataplaneThreadsOptions, onEnd: (t: Thread, code: number) => void) {
    this.governor = start.governor;
    this.#record = (r) => host.metrics.record(r);
    // Run from source under tsx (`npx tsx bench/…`) this module is the .ts file; compiled it is .js: start the worker in the same form.
    this.worker = import.meta.url.endsWith('.ts')
      ? // The tsx loader of the parent does not reach a worker's module loader: register it there first.
        new Worker(`import('tsx/esm/api').then((tsx) => { tsx.register(); return import(${JSON.stringify(new URL('./worker.ts', import.meta.url).href)}); })`, { eval: true, workerData: start })
      : new Worker(new URL('./worker.js', import.meta.url), { workerData: start });
    this.worker.on('message', (m: FromWorker) => this.#onMessage(m, host));
    this.worker.on('error', (err) => host.log.error({ err }, 'data plane thread failed'));
    this.ended = new Promise((resolve) =>
      this.worker.once('exit', (code) => {
        onEnd(this, code);
        resolve();
      }),
    );
  }

  post(m: ToWorker): void {
    this.worker.postMessage(m);
  }

  /** Resolves with the port once the thread listens; rejects when it cannot. */
  listening(): Promise<number> {
    return new Promise((resolve, reject) => {
      const onMessage = (m: FromWorker) => {
        if (m.t === 'listening') {
          this.port = m.port;
          done();
          resolve(m.port);
        } else if (m.t === 'failed') {
          done();
          void this.worker.terminate();
          reject(new Error(m.message));
        }
      };
      const onExit = (code: number) => {
        done();
        reject(new Error(`data plane thread exited (code ${code}) before listening`));
      };
      const done = () => {
        this.worker.off('message', onMessage);
        this.worker.off('exit', onExit);
      };
      this.worker.on('message', onMessage);
      this.worker.on('exit', onExit);
    });
  }

  #onMessage(m: FromWorker, host: DataplaneThreadsOptions): void {
    if (m.t === 'closed') {
      // Everything is flushed and the listener closed: nothing left that needs the thread.
      void this.worker.terminate();
    } else if (m.t === 'records') {
      if (m.records !== null) {
        this.served += m.records.n;
        unpackRecords(m.records, this.#record);
      }
      for (const [pool, policy, reason] of m.refusals) host.metrics.policyRefused?.(pool, policy, reason);
    } else if (m.t === 'nonce') {
      Promise.resolve()
        .then(() => host.nonces.claim(m.nonce, m.ttlMs))
        .then(
          (claim) => this.post({ t: 'nonced', id: m.id, claim }),
          // A claim that cannot be made must not admit: `full` answers 503 in the thread.
          () => this.post({ t: 'nonced', id: m.id, claim: 'full' }),
        );
    } else if (m.t === 'spill') {
      const job = m.job;
      // The body crossed as a Uint8Array; the store wants a Buffer (bytea).
      const body = job.request.body as Uint8Array | null;
      if (body !== null && !Buffer.isBuffer(body)) job.request.body = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
      host.jobs.spill(job).then(
        () => this.post({ t: 'spilled', id: m.id, ok: true, lockApiUrl: host.jobs.lockApiUrl() }),
        (err: unknown) => {
          host.log.error({ err, poolId: job.poolId }, 'spilling an async job from a data plane thread failed');
          this.post({ t: 'spilled', id: m.id, ok: false, lockApiUrl: host.jobs.lockApiUrl() });
        },
      );
    }
  }
}

/** A thread that lived this long before it died is restarted after the shortest delay again. */
const STABLE_MS = 60_000;
const RESTART_MIN_MS = 500;
const RESTART_MAX_MS = 30_000;

export class DataplaneThreads {
  readonly #opts: DataplaneThreadsOptions;
  readonly #threads: Thread[] = [];
  #closing: Promise<void> | null = null;
  #restarts = 0;
  #restartDelayMs = RESTART_MIN_MS;
  readonly #restartTimers = new Set<NodeJS.Timeout>();

  private constructor(opts: DataplaneThreadsOptions) {
    this.#opts = opts;
  }

  /**
   * Starts the threads and resolves once every one listens. Shared: every thread binds proxyPort (0: one
   * free port found first; another is tried if it was taken meanwhile); each: thread i binds proxyPort+i
   * (or a free one).
   */
  static async start(opts: DataplaneThreadsOptions): Promise<DataplaneThreads> {
    const host = new DataplaneThreads(opts);
    const { config, dataplane } = opts;
    // Followed before the first thread is made: every later change is queued to every thread in order.
    dataplane.followSnapshots({
      loaded: (snapshot) => host.#broadcast({ t: 'snapshot', snapshot }),
      keys: (changes) => host.#broadcast({ t: 'keys', changes }),
    });
    const spawn = (port: number) => {
      const t = host.#spawn(port);
      host.#threads.push(t);
      return t.listening();
    };
    try {
      if (proxyHttpParser(config) === 'uws') opts.log.warn({ proxyHttpParser: 'uws' }, UWS_LIMITS);
      if (config.dataplaneThreadPorts === 'shared') {
        for (let attempt = 1; ; attempt++) {
          const port = config.proxyPort || (await freePort(config.host));
          const all = await Promise.allSettled(Array.from({ length: opts.threads }, () => spawn(port)));
          const failed = all.find((r): r is PromiseRejectedResult => r.status === 'rejected');
          if (!failed) break;
          await host.#stopThreads();
          if (config.proxyPort !== 0 || attempt === 3) throw new Error(`${SHARED_PORT_HELP} (${(failed.reason as Error).message})`);
        }
      } else {
        await Promise.all(Array.from({ length: opts.threads }, (_, i) => spawn(config.proxyPort === 0 ? 0 : config.proxyPort + i)));
      }
    } catch (err) {
      await host.close();
      throw err;
    }
    return host;
  }

  /** A thread on `port`; one that dies unplanned is replaced (see #restart). */
  #spawn(port: number): Thread {
    const { config, dataplane, governor, jobs } = this.#opts;
    return new Thread(
      { config, governor: governor.handle(), port, snapshot: dataplane.snapshots.current, lockApiUrl: jobs.lockApiUrl(), drainMs: this.#opts.drainMs ?? 10_000 },
      this.#opts,
      (thread, code) => {
        // Whatever the thread still held (a crash mid-request) goes back to the pools.
        governor.reclaim(thread.governor);
        if (this.#closing || thread.stopped) return;
        this.#opts.log.error({ code, port: thread.port }, 'a data plane thread exited; the others serve its share until it is replaced');
        this.#restart(thread);
      },
    );
  }

  /**
   * Replaces a thread that died, on its port, after a delay that doubles while threads keep dying young
   * (a crash loop must not spin) and starts over once one has lived a minute.
   */
  #restart(dead: Thread): void {
    this.#restartDelayMs = Date.now() - dead.startedAt >= STABLE_MS ? RESTART_MIN_MS : Math.min(this.#restartDelayMs * 2, RESTART_MAX_MS);
    const timer = setTimeout(() => {
      this.#restartTimers.delete(timer);
      const i = this.#threads.indexOf(dead);
      if (this.#closing || i < 0) return;
      // Its own port again (bound with SO_REUSEPORT, so the closed connections still in TIME_WAIT there do
      // not block it); a thread whose port was an ephemeral one (proxyPort 0, ports each) gets a new one.
      const { config } = this.#opts;
      const fresh = this.#spawn(config.proxyPort === 0 && config.dataplaneThreadPorts === 'each' ? 0 : dead.port);
      fresh.port = dead.port;
      this.#threads[i] = fresh;
      this.#restarts++;
      fresh.listening().then(
        () => this.#opts.log.warn({ port: fresh.port, restarts: this.#restarts }, 'data plane thread replaced'),
        // Its exit (which follows) schedules the next try.
        (err: unknown) => this.#opts.log.error({ err, port: dead.port }, 'a replacement data plane thread did not start'),
      );
    }, this.#restartDelayMs);
    timer.unref();
    this.#restartTimers.add(timer);
  }

  /** Threads replaced after dying since start. */
  get restarts(): number {
    return this.#restarts;
  }

  /** Makes one thread throw an uncaught error (tests of the crash path): it closes, exits and is replaced. */
  crashThread(index: number): void {
    this.#threads[index]?.post({ t: 'crash' });
  }

  /** The port of the first thread (every thread's, when shared). */
  get port(): number {
    return this.#threads[0]?.port ?? 0;
  }

  /** Each thread's port, in thread order. */
  get ports(): number[] {
    return this.#threads.map((t) => t.port);
  }

  /** Requests each thread has finished (counted as their records arrive): how the kernel spread the connections. */
  get served(): number[] {
    return this.#threads.map((t) => t.served);
  }

  /** Stops the threads started so far (a failed shared start), keeping the host usable for another try. */
  async #stopThreads(): Promise<void> {
    const threads = this.#threads.splice(0);
    for (const t of threads) {
      t.stopped = true;
      t.post({ t: 'close' });
    }
    await Promise.all(
      threads.map(async (t) => {
        const timer = setTimeout(() => void t.worker.terminate(), 5_000);
        await t.ended;
        clearTimeout(timer);
      }),
    );
  }

  #broadcast(m: ToWorker): void {
    for (const t of this.#threads) t.post(m);
  }

  /** Each thread stops accepting, lets its in-flight requests finish (up to drainMs) and exits. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      for (const timer of this.#restartTimers) clearTimeout(timer);
      this.#restartTimers.clear();
      this.#broadcast({ t: 'close' });
      const limit = (this.#opts.drainMs ?? 10_000) + 5_000;
      await Promise.all(
        this.#threads.map(async (t) => {
          const timer = setTimeout(() => void t.worker.terminate(), limit);
          await t.ended;
          clearTimeout(timer);
        }),
      );
      this.#opts.dataplane.followSnapshots(null);
    })();
    return this.#closing;
  }
}
