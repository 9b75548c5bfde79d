// Starts the roles of one process (control, dataplane, worker) on one store, and stops them in the order
// written below. Each part is a module of src/roles/ with its own start and stop.
import { SYSTEM_TIME, type GovernorTime } from './governor/clock.js';
import { resolve } from 'node:path';
import type { Config } from './config/schema.js';
import type { ControlApp } from './control/app.js';
import type { LiveSource } from './control/context.js';
import { startAdminSocket } from './admin/socket.js';
import { loadUws } from './http/uws/load.js';
import { proxyHttpParser } from './dataplane/http-parser.js';
import { createLogger, type LogFormat, type Logger } from './log.js';
import type { Dataplane } from './dataplane/server.js';
import type { DataplaneThreads } from './dataplane/threads/host.js';
import type { MysqlListener } from './db/mysqlwire/listener.js';
import type { PgWireListener } from './db/pgwire/listener.js';
import type { JobRunner, JobRunnerTuning } from './jobs/runner.js';
import type { RollupBuffer } from './metrics/rollups.js';
import type { SecretBox } from './security/secret-box.js';
import { systemLookup, type Lookup } from './security/targets.js';
import type { Sql } from './store/sql.js';
import { Health } from './health.js';
import { closes, stopInOrder, type Ports, type RoleContext, type Running } from './roles/role.js';
import { openServiceStore } from './roles/store.js';
import { startControl, type ControlRole } from './roles/control.js';
import { startWebhookDelivery } from './roles/webhook-delivery.js';
import { startDataplaneRole, type DataplaneRole } from './roles/dataplane.js';
import { startJobRunner, type JobRunnerRole } from './roles/job-runner.js';
import { startHealthServer } from './roles/health-server.js';
import { listenersCheck, storeCheck } from './roles/health-checks.js';
import { holdTickShape } from './runtime/tick-shape.js';

export type { Ports } from './roles/role.js';

export type RoleName = 'control' | 'dataplane' | 'worker';

export interface ServiceOptions {
  config: Config;
  roles: readonly RoleName[];
  /** DNS resolution used by the target guard; tests pass one that maps names to fixed addresses. */
  lookup?: Lookup;
  now?: () => Date;
  /** The in-memory governor's time and timers (waits, queue timeouts, the RPM gate); tests drive them. */
  governorTime?: Readonly<GovernorTime>;
  /** The webhook deliverer's send timeout (clock and timers); tests drive it. */
  webhookTime?: Readonly<Pick<GovernorTime, 'now' | 'timers'>>;
  log?: Logger;
  /** The job runner's limits (result cap, retry backoff, jitter source); tests make them small. */
  jobs?: JobRunnerTuning;
}

export interface Service {
  readonly config: Config;
  readonly sql: Sql;
  readonly box: SecretBox;
  readonly log: Logger;
  readonly now: () => Date;
  readonly ports: Ports;
  readonly control: ControlApp | null;
  /** The pool traffic listener (and its governor), when this process runs the dataplane role. */
  readonly dataplane: Dataplane | null;
  /** The per-minute pool traffic counts behind the metrics summary (flush() writes them now). */
  readonly rollups: RollupBuffer | null;
  /** The async job runner, when this process runs the worker role. */
  readonly jobs: JobRunner | null;
  /** The pool listener threads, when dataplaneThreads is above 1. */
  readonly dataplaneThreads: DataplaneThreads | null;
  /** The MySQL wire listener, when this process runs the dataplane role. */
  readonly mysql: MysqlListener | null;
  /** The PostgreSQL wire listener, when this process runs the dataplane role. */
  readonly pgWire: PgWireListener | null;
  /** Liveness and readiness of this process (served at /livez, /readyz, /healthz). */
  readonly health: Health;
  close(): Promise<void>;
}

export async function startService(opts: ServiceOptions): Promise<Service> {
  // Before any traffic or store start-up collection (src/runtime/tick-shape.ts).
  holdTickShape();
  const { config, roles } = opts;
  if (roles.length < 3 && !config.databaseUrl) {
    throw new Error('running roles in separate processes needs a shared store: set DATABASE_URL (PostgreSQL)');
  }
  // Refuse early, before anything binds, when uWS was asked for and its native build is missing.
  if (roles.includes('dataplane') && proxyHttpParser(config) === 'uws') loadUws();

  const store = await openServiceStore(config);
  const { sql, box } = store;
  const now = opts.now ?? (() => new Date());
  // Unix ms for the data plane's per-request checks (key expiry): Date.now itself unless a test fixes the time,
  // so no Date object is made per request.
  const nowOverride = opts.now;
  const clock: () => number = nowOverride ? () => nowOverride().getTime() : Date.now;
  const log = opts.log ?? createLogger(config.logLevel, config.logFormat as LogFormat);
  const ports: Ports = {};
  const health = new Health(roles);
  health.add(storeCheck(sql));
  const rc: RoleContext = {
    config, sql, box, log, now, clock, health, ports,
    governorTime: opts.governorTime ?? SYSTEM_TIME,
    webhookTime: opts.webhookTime ?? SYSTEM_TIME,
    lookup: opts.lookup ?? systemLookup,
    // Where jobs are polled: the lock API's public address (its port is known once it listens).
    lockApiUrl: () => config.lockApiUrl ?? `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${ports.lock ?? config.lockPort}`,
  };
  // The dashboard's live numbers: filled in by the data plane role when it shares this process.
  const live: { source: LiveSource | null } = { source: null };

  // Each part, once started (null: not started, or not a role of this process).
  let control: ControlRole | null = null;
  let admin: Running | null = null;
  let delivery: Running | null = null;
  let dataplane: DataplaneRole | null = null;
  let jobs: JobRunnerRole | null = null;
  let healthServer: Running | null = null;

  // The shutdown order, in one place: the reverse of the start order below.
  //  1. health server: only in a process without the dataplane role (which serves the probes itself).
  //  2. job runner: running jobs finish while their slots are still honoured (the data plane's governor,
  //     when it shares the process, is still open).
  //  3. dataplane: stops taking pool, lock and wire traffic and drains; then its metrics server, the final
  //     rollup flush and its governor (the order inside is in roles/dataplane.ts).
  //  4. webhook deliverer: after the runner and the data plane, which write the outbox; in-flight sends
  //     finish, and the threads the runner's enqueue used end.
  //  5. admin socket, 6. Control API: they keep answering while the traffic roles drain.
  //  7. the store last, since every part above uses it; then the data dir is free for another process.
  const stopAll = () => stopInOrder([healthServer, jobs, dataplane, delivery, admin, control, store]);

  try {
    if (roles.includes('control')) control = await startControl(rc, live);
    if (!config.databaseUrl) {
      // The embedded store is held by this process; admin commands reach it through this socket.
      admin = closes(await startAdminSocket(resolve(config.dataDir), { config, sql, box, now, live }));
    }
    if (roles.includes('worker')) delivery = await startWebhookDelivery(rc);
    if (roles.includes('dataplane')) dataplane = await startDataplaneRole(rc, live);
    if (roles.includes('worker')) jobs = await startJobRunner(rc, dataplane?.dataplane ?? null, opts.jobs);
    if (!dataplane) healthServer = await startHealthServer(rc);
    health.add(listenersCheck(ports));
    health.serving();
  } catch (err) {
    await stopAll();
    throw err;
  }

  let closing: Promise<void> | null = null;
  return {
    config,
    sql,
    box,
    log,
    now,
    ports,
    control: control?.app ?? null,
    dataplane: dataplane?.dataplane ?? null,
    rollups: dataplane?.rollups ?? null,
    jobs: jobs?.runner ?? null,
    dataplaneThreads: dataplane?.threads ?? null,
    mysql: dataplane?.mysql ?? null,
    pgWire: dataplane?.pgWire ?? null,
    health,
    close() {
      health.draining();
      // Not ready from the first call; the parts stop once, in the order above.
      closing ??= stopAll();
      return closing;
    },
  };
}
