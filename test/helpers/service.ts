// Starts poolgate in-process on random ports with a fresh store (PGlite in a temp dir, copied from the
// run's migrated template, or a fresh PostgreSQL database), and tears everything down after the test.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { Pool, request, type Dispatcher } from 'undici';
import { loadConfig } from '../../src/config/load.js';
import type { Config } from '../../src/config/schema.js';
import { startService, type RoleName, type Service } from '../../src/service.js';
import { runAdmin } from '../../src/admin/commands.js';
import type { JobRunnerTuning } from '../../src/jobs/runner.js';
import type { Lookup } from '../../src/security/targets.js';
import { createLogger, type Logger } from '../../src/log.js';
import { PG_URL } from './servers.js';
import { OpenApiOracle, type OpenApiDoc } from './openapi.js';
import { seedPgliteDataDir } from './pglite-template.js';

export type Engine = 'pglite' | 'postgres';

export interface TestService {
  service: Service;
  config: Config;
  controlUrl: string;
  /** Pool traffic (send `Host: <subdomain>.{poolDomain}`) and Prometheus, when the dataplane role runs. */
  proxyUrl: string | null;
  metricsUrl: string | null;
  /** The lock API listener, when the dataplane role runs. */
  lockUrl: string | null;
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

/** A fresh PostgreSQL database on the local server; dropped by the returned function. */
export async function freshPostgresDatabase(): Promise<{ url: string; drop(): Promise<void> }> {
  const name = `poolgate_t_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const url = new URL(PG_URL);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    async drop() {
      const c = new pg.Client({ connectionString: PG_URL });
      await c.connect();
      await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await c.end();
    },
  };
}

export async function startTestService(
  opts: {
    engine?: Engine;
    roles?: RoleName[];
    overrides?: Partial<Record<keyof Config, unknown>>;
    lookup?: Lookup;
    dataDir?: string;
    /** The job runner's limits: small result caps and backoffs keep job tests fast. */
    jobs?: JobRunnerTuning;
    /** The service's logger (default: silent, or POOLGATE_TEST_LOG's level). */
    log?: Logger;
    /** The service's clock (key expiry, lease terms, …): a TestClock's `now` lets a test move time ahead. */
    now?: () => Date;
  } = {},
): Promise<TestService> {
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
      // TEST_LOG_LEVEL=warn (or debug) shows the service's log while a test runs.
      logLevel: process.env.TEST_LOG_LEVEL ?? 'silent',
      // TEST_PROXY_HTTP_PARSER=node runs a test file's pool traffic through the node:http listener.
      ...(process.env.TEST_PROXY_HTTP_PARSER ? { proxyHttpParser: process.env.TEST_PROXY_HTTP_PARSER } : {}),
      ...opts.overrides,
    },
  });
  let service: Service;
  try {
    service = await startService({
      config,
      roles: opts.roles ?? ['control', 'dataplane', 'worker'],
      lookup: opts.lookup,
      jobs: opts.jobs,
      now: opts.now,
      log: opts.log ?? createLogger(process.env.POOLGATE_TEST_LOG ?? 'silent'),
    });
  } catch (err) {
    // A service that did not start leaves no temp dir or database behind.
    if (db) await db.drop().catch(() => {});
    if (!opts.dataDir) rmSync(dataDir, { recursive: true, force: true });
    throw err;
  }
  const controlUrl = `http://127.0.0.1:${service.ports.control}`;
  const deps = { config, sql: service.sql, box: service.box, now: service.now };
  let oracle: Promise<OpenApiOracle> | null = null;
  // A dispatcher sends the path exactly as given (no URL normalisation), so tests can send `..` and odd bytes.
  const http = new Pool(controlUrl, { connections: 8 });

  const t: TestService = {
    service,
    config,
    controlUrl,
    proxyUrl: service.ports.proxy !== undefined ? `http://127.0.0.1:${service.ports.proxy}` : null,
    metricsUrl: service.ports.metrics !== undefined ? `http://127.0.0.1:${service.ports.metrics}` : null,
    lockUrl: service.ports.lock !== undefined ? `http://127.0.0.1:${service.ports.lock}` : null,
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
      const res = await http.request({ path, method, headers, body });
      const text = await res.body.text();
      let parsed: unknown = text;
      try {
        parsed = text ? JSON.parse(text) : undefined;
      } catch {
        /* not JSON: keep the text so the test can say so */
      }
      const contentType = String(res.headers['content-type'] ?? '');
      const mismatch = (await t.openapi()).checkResponse(method, path, res.statusCode, contentType, parsed, text);
      if (mismatch) throw new Error(`response does not match the OpenAPI document: ${mismatch}`);
      return { status: res.statusCode, body: parsed, headers: res.headers as Record<string, unknown> };
    },
    openapi() {
      oracle ??= (async () => {
        const res = await request(`${controlUrl}/api/v1/openapi.json`, { headers: { accept: 'application/json' } });
        if (res.statusCode !== 200) throw new Error(`GET /api/v1/openapi.json answered ${res.statusCode}`);
        return new OpenApiOracle((await res.body.json()) as OpenApiDoc);
      })();
      return oracle;
    },
    async close() {
      await http.close();
      await service.close();
      if (db) await db.drop();
      if (!opts.dataDir) rmSync(dataDir, { recursive: true, force: true });
    },
  };
  return t;
}
