// A MariaDB-backed mysql pool for the MySQL wire listener tests: a fresh database and a role (user with a
// password and grants on it), poolgate started in-process, the pool created and given the role through
// the Control API, and a write key. Everything is dropped at teardown.
import { randomBytes } from 'node:crypto';
import { spawn } from 'node:child_process';
import mysql from 'mysql2/promise';
import type { Test } from 'tap';
import { startTestService, type TestService } from './service.js';
import { MYSQL, mysqlAccount } from './servers.js';
import { CHANGE_CHANNEL } from '../../src/store/sql.js';
import type { Logger } from '../../src/log.js';

export interface WirePool {
  svc: TestService;
  token: string;
  sub: string;
  poolId: number;
  key: string;
  port: number;
  user: string;
  db: string;
  /** Root connection to MariaDB (counting processes, KILL). */
  root: mysql.Connection;
  /** A mysql2 connection through poolgate. */
  connect(o?: { user?: string; password?: string; database?: string; multipleStatements?: boolean; ssl?: mysql.SslOptions }): Promise<mysql.Connection>;
  /** Sets max_concurrent and settings of the pool and waits for the data plane to see them. */
  setPool(maxConcurrent: number, settings?: Record<string, unknown>): Promise<void>;
  /** Upstream sessions of the role, and those running a statement matching `like`. */
  processes(like?: string): Promise<number>;
}

export async function wirePool(t: Test, opts: { maxConcurrent?: number; overrides?: Record<string, unknown>; log?: Logger } = {}): Promise<WirePool> {
  const suffix = randomBytes(4).toString('hex');
  const user = `wire_${suffix}`;
  const db = `wire_${suffix}`;
  const password = 'Wire-Pa55';
  const root = await mysqlAccount(t, { db, user, password });
  const svc = await startTestService({ overrides: { dbAllowInsecure: true, accessLogFile: '/dev/null', ...opts.overrides }, ...(opts.log ? { log: opts.log } : {}) });
  t.teardown(() => svc.close());
  const boot = await svc.bootstrap();
  const created = await svc.api('POST', '/api/v1/pools/database', {
    token: boot.token,
    body: { db_host: '127.0.0.1', db_port: 3306, db_name: db, ...(opts.maxConcurrent ? { max_concurrent: opts.maxConcurrent } : {}) },
  });
  if (created.status !== 201) throw new Error(`pool not created: ${JSON.stringify(created.body)}`);
  const sub: string = created.body.data.subdomain;
  const poolId: number = created.body.data.id;
  const cred = await svc.api('PUT', `/api/v1/pools/${sub}/credential`, { token: boot.token, body: { method: 'postgres_role', username: user, password } });
  if (cred.status !== 200) throw new Error(`role not attached: ${JSON.stringify(cred.body)}`);
  const key: string = (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token: boot.token, body: { label: 'wire' } })).body.data.key;
  await svc.service.dataplane!.snapshots.reload();
  const port = svc.service.ports.mysql!;
  return {
    svc,
    token: boot.token,
    sub,
    poolId,
    key,
    port,
    user,
    db,
    root,
    connect: (o = {}) =>
      mysql.createConnection({
        host: '127.0.0.1',
        port,
        user: o.user ?? sub,
        password: o.password ?? key,
        database: o.database,
        multipleStatements: o.multipleStatements ?? false,
        connectTimeout: 20_000,
        ...(o.ssl ? { ssl: o.ssl } : {}),
      }),
    async setPool(maxConcurrent, settings) {
      if (settings) await svc.service.sql.query('UPDATE pools SET max_concurrent = $1, settings = $2 WHERE id = $3', [maxConcurrent, JSON.stringify(settings), poolId]);
      else await svc.service.sql.query('UPDATE pools SET max_concurrent = $1 WHERE id = $2', [maxConcurrent, poolId]);
      await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${poolId}`);
      await svc.service.dataplane!.snapshots.reload();
    },
    async processes(like) {
      const [rows] = like
        ? await root.query(`SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE USER = ? AND COMMAND = 'Query' AND INFO LIKE ?`, [user, `%${like}%`])
        : await root.query('SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE USER = ?', [user]);
      return Number((rows as Array<{ n: number }>)[0]!.n);
    },
  };
}

/**
 * A wire pool with what most listener tests look at beside it: the listener, the governor and a direct
 * connection to the pool's database (closed at teardown) in which `ddl` has run.
 */
export async function wireFixture(t: Test, ddl: string[] = []) {
  const w = await wirePool(t);
  const listener = w.svc.service.mysql!;
  const governor = w.svc.service.dataplane!.governor;
  const direct = await mysql.createConnection({ ...MYSQL, database: w.db });
  t.teardown(() => direct.end());
  for (const statement of ddl) await direct.query(statement);
  return { w, listener, governor, direct };
}

/** Runs the `mariadb` command-line client; resolves with its exit code and output. */
export function mariadbCli(args: string[], input?: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn('mariadb', args, { stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
    child.stdin.end(input ?? '');
  });
}
