// Starts poolgate in-process on random ports with a fresh store (PGlite in a temp dir, copied from the
// run's migrated template, or a fresh PostgreSQL database), and tears everything down after the test.
import type { GovernorTime } from '../../src/governor/clock.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { Pool, type Dispatcher } from 'undici';
import { loadConfig } from '../../src/config/load.js';
import type { Config } from '../../src/config/schema.js';
import { startService, type RoleName, type Service } from '../../src/service.js';
import type { ControlApp } from '../../src/control/app.js';
import { buildControl } from '../../src/roles/control.js';
import { openServiceStore } from '../../src/roles/store.js';
import { Health } from '../../src/health.js';
import type { SecretBox } from '../../src/security/secret-box.js';
import type { Sql } from '../../src/store/sql.js';
import { ownHosts, systemLookup } from '../../src/security/targets.js';
import { runAdmin } from '../../src/admin/commands.js';
import type { JobRunnerTuning } from '../../src/jobs/runner.js';
import type { Lookup } from '../../src/security/targets.js';
import { createLogger, type Logger } from '../../src/log.js';
import { freshPostgresDatabase } from './postgres-database.js';
import { OpenApiOracle, type OpenApiDoc } from './openapi.js';
import { seedPgliteDataDir } from './pglite-template.js';

export type Engine = 'pglite' | 'postgres';

/** The Control API as a test calls it: over a socket (TestService) or in process (TestApi). */
export interface ApiClient {
  config: Config;
  /** The Control API's public address (its links: intake, dashboard): the listener's, or inject()'s localhost. */
  baseUrl: string;
  sql: Sql;
  box: SecretBox;
  /** Runs `poolgate admin …` against this service's store and parses its JSON output. */
  admin(argv: string[]): Promise<any>;
  /** Bootstraps a team and returns its owner's token. */
  bootstrap(opts?: { team?: string; plan?: string; email?: string }): Promise<{ token: string; team: { id: number; slug: string }; user: { id: number } }>;
  /**
   * One Control API call. Every response is checked against the OpenAPI document the service serves
   * (the schema for its route and status; an Error body for undeclared 4xx/5xx): a mismatch throws.
   */
  api(method: Dispatcher.HttpMethod, path: string, opts?: { token?: string | null; body?: unknown; rawBody?: string | Buffer; headers?: Record<string, string> }): Promise<{ status: number; body: any; headers: Record<string, unknown> }>;
  /** The served OpenAPI document, loaded once, with its operations and response checker. */
  openapi(): Promise<OpenApiOracle>;
  close(): Promise<void>;
}

export interface TestService extends ApiClient {
  service: Service;
  controlUrl: string;
  /** Pool traffic (send `Host: <subdomain>.{poolDomain}`) and Prometheus, when the dataplane role runs. */
  proxyUrl: string | null;
  metricsUrl: string | null;
  /** The lock API listener, when the dataplane role runs. */
  lockUrl: string | null;
}

/**
 * The Control API alone, in process, on no socket (issue 28 §1, fastify's own suite is the model): the app
 * startControl would bind, answering through fastify's inject(). For tests of the API itself; a test of how
 * the parts are wired together boots the whole service (startTestService).
 */
export interface TestApi extends ApiClient {
  app: ControlApp;
}


export interface TestStoreOptions {
  engine?: Engine;
  overrides?: Partial<Record<keyof Config, unknown>>;
  lookup?: Lookup;
  dataDir?: string;
  /** The service's logger (default: silent, or POOLGATE_TEST_LOG's level). */
  log?: Logger;
  /** The service's clock (key expiry, lease terms, …): a TestClock's `now` lets a test move time ahead. */
  now?: () => Date;
}

/** A test's config on a fresh store (PGlite dir from the template, or a fresh PostgreSQL database); `drop` removes it. */
async function testConfig(opts: TestStoreOptions): Promise<{ config: Config; drop(): Promise<void> }> {
  const dataDir = opts.dataDir ?? mkdtempSync(join(tmpdir(), 'poolgate-test-'));
  // A data dir the caller passes is used as it is (restart tests, stores shared by two services).
  if (!opts.dataDir && opts.engine !== 'postgres' && !opts.overrides?.databaseUrl) await seedPgliteDataDir(dataDir);
  const db = opts.engine === 'postgres' ? await freshPostgresDatabase() : null;
  const config = loadConfig({
    env: {},
    overrides: {
      host: '127.0.0.1',
      controlPort: 0,
      proxyPort: 0,
      lockPort: 0,
      metricsPort: 0,
      pgPort: 0,
      mysqlPort: 0,
      dataDir,
      databaseUrl: db?.url ?? null,
      allowPrivateTargets: true,
      // A smaller buffer pool than the service's 32 MB: PGlite zeroes and touches its shared memory at every open,
      // ~70 ms of CPU per store at 32 MB against 8 MB (docs/testing.md); a test store holds a few hundred rows.
      embeddedSharedBuffersMb: 8,
      // TEST_LOG_LEVEL=warn (or debug) shows the service's log while a test runs.
      logLevel: process.env.TEST_LOG_LEVEL ?? 'silent',
      // TEST_PROXY_HTTP_PARSER=node runs a test file's pool traffic through the node:http listener.
      ...(process.env.TEST_PROXY_HTTP_PARSER ? { proxyHttpParser: process.env.TEST_PROXY_HTTP_PARSER } : {}),
      ...opts.overrides,
    },
  });
  return {
    config,
    async drop() {
      if (db) await db.drop();
      if (!opts.dataDir) rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

export async function startTestService(
  opts: TestStoreOptions & {
    roles?: RoleName[];
    /** The job runner's limits: small result caps and backoffs keep job tests fast. */
    jobs?: JobRunnerTuning;
    /** The in-memory governor's time and timers: a DrivenGovernorTime lets a test jump over a queue timeout. */
    governorTime?: GovernorTime;
    /** The webhook deliverer's send timeout: a DrivenGovernorTime lets a test pass the 5 s without waiting. */
    webhookTime?: Pick<GovernorTime, 'now' | 'timers'>;
  } = {},
): Promise<TestService> {
  const { config, drop } = await testConfig(opts);
  let service: Service;
  try {
    service = await startService({
      config,
      roles: opts.roles ?? ['control', 'dataplane', 'worker'],
      lookup: opts.lookup,
      jobs: opts.jobs,
      governorTime: opts.governorTime,
      webhookTime: opts.webhookTime,
      now: opts.now,
      log: opts.log ?? createLogger(process.env.POOLGATE_TEST_LOG ?? 'silent'),
    });
  } catch (err) {
    // A service that did not start leaves no temp dir or database behind.
    await drop().catch(() => {});
    throw err;
  }
  const controlUrl = `http://127.0.0.1:${service.ports.control}`;
  // A dispatcher sends the path exactly as given (no URL normalisation), so tests can send `..` and odd bytes.
  const http = new Pool(controlUrl, { connections: 8 });
  const client = apiClient(config, controlUrl, service.sql, service.box, service.now, async (req) => {
    const res = await http.request({ path: req.path, method: req.method, headers: req.headers, body: req.body });
    return { status: res.statusCode, text: await res.body.text(), headers: res.headers as Record<string, unknown> };
  }, async () => {
    await http.close();
    await service.close();
    await drop();
  });
  return {
    ...client,
    service,
    controlUrl,
    proxyUrl: service.ports.proxy !== undefined ? `http://127.0.0.1:${service.ports.proxy}` : null,
    metricsUrl: service.ports.metrics !== undefined ? `http://127.0.0.1:${service.ports.metrics}` : null,
    lockUrl: service.ports.lock !== undefined ? `http://127.0.0.1:${service.ports.lock}` : null,
  };
}

/** The Control API on a fresh store, in process and not listening: requests go through fastify's inject(). */
export async function startTestApi(opts: TestStoreOptions = {}): Promise<TestApi> {
  const { config, drop } = await testConfig(opts);
  let store: Awaited<ReturnType<typeof openServiceStore>>;
  try {
    store = await openServiceStore(config);
  } catch (err) {
    await drop().catch(() => {});
    throw err;
  }
  const now = opts.now ?? (() => new Date());
  const log = opts.log ?? createLogger(process.env.POOLGATE_TEST_LOG ?? 'silent');
  let app: ControlApp;
  let baseUrl: string;
  try {
    let urls: { base: string; lockApi: string; dashboard: string };
    let own: string[];
    ({ app, urls, own } = await buildControl({ config, sql: store.sql, box: store.box, now, log, lookup: opts.lookup ?? systemLookup, health: new Health(['control']) }, { source: null }));
    // The public addresses startControl takes from the bound port: inject() answers as host localhost.
    if (!config.baseUrl) urls.base = 'http://localhost';
    if (!config.dashboardUrl) urls.dashboard = `${urls.base}/dashboard`;
    if (!config.lockApiUrl) urls.lockApi = `http://localhost:${config.lockPort}`;
    own.splice(0, own.length, ...ownHosts(config, [urls.base, urls.lockApi]));
    baseUrl = urls.base;
    await app.ready();
  } catch (err) {
    await store.stop();
    await drop().catch(() => {});
    throw err;
  }
  const client = apiClient(config, baseUrl, store.sql, store.box, now, async (req) => {
    const res = await app.inject({ method: req.method as 'GET', url: req.path, headers: req.headers, payload: req.body });
    return { status: res.statusCode, text: res.body, headers: res.headers as Record<string, unknown> };
  }, async () => {
    await app.close();
    await store.stop();
    await drop();
  });
  return { ...client, app };
}

/** One request to the Control API, however it is carried (a socket, or inject()). */
type Send = (req: { method: Dispatcher.HttpMethod; path: string; headers: Record<string, string>; body: string | Buffer | undefined }) => Promise<{ status: number; text: string; headers: Record<string, unknown> }>;

/** The calls every Control API test makes, over `send`; every response is checked against the OpenAPI document. */
function apiClient(config: Config, baseUrl: string, sql: Sql, box: SecretBox, now: () => Date, send: Send, close: () => Promise<void>): ApiClient {
  const deps = { config, sql, box, now };
  let oracle: Promise<OpenApiOracle> | null = null;
  const t: ApiClient = {
    config,
    baseUrl,
    sql,
    box,
    async admin(argv) {
      const res = await runAdmin(argv, deps);
      if (res.code !== 0) throw new Error(`admin ${argv.join(' ')} failed (${res.code}): ${res.stderr}`);
      return JSON.parse(res.stdout);
    },
    async bootstrap(b = {}) {
      return t.admin([
        'bootstrap',
        '--team', b.team ?? `team-${randomBytes(3).toString('hex')}`,
        '--email', b.email ?? `owner-${randomBytes(3).toString('hex')}@example.test`,
        '--plan', b.plan ?? 'team',
      ]);
    },
    async api(method, path, o = {}) {
      const headers: Record<string, string> = { accept: 'application/json', ...o.headers };
      if (o.token) headers.authorization = `Bearer ${o.token}`;
      let body: string | Buffer | undefined = o.rawBody;
      if (o.body !== undefined) {
        body = JSON.stringify(o.body);
        headers['content-type'] ??= 'application/json';
      }
      const res = await send({ method, path, headers, body });
      const text = res.text;
      let parsed: unknown = text;
      try {
        parsed = text ? JSON.parse(text) : undefined;
      } catch {
        /* not JSON: keep the text so the test can say so */
      }
      const contentType = String(res.headers['content-type'] ?? '');
      const mismatch = (await t.openapi()).checkResponse(method, path, res.status, contentType, parsed, text);
      if (mismatch) throw new Error(`response does not match the OpenAPI document: ${mismatch}`);
      return { status: res.status, body: parsed, headers: res.headers };
    },
    openapi() {
      oracle ??= (async () => {
        const res = await send({ method: 'GET', path: '/api/v1/openapi.json', headers: { accept: 'application/json' }, body: undefined });
        if (res.status !== 200) throw new Error(`GET /api/v1/openapi.json answered ${res.status}`);
        return new OpenApiOracle(JSON.parse(res.text) as OpenApiDoc);
      })();
      return oracle;
    },
    close,
  };
  return t;
}
