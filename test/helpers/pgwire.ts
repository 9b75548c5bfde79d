// A PostgreSQL pool behind poolgate's wire listener, for tests: a fresh role and database on the local
// server, poolgate started in-process, the pool made and given its role through the Control API, a key.
import { randomBytes } from 'node:crypto';
import { spawn } from 'node:child_process';
import { connect as tcpConnect, createServer, type Socket } from 'node:net';
import pg from 'pg';
import type { Test } from 'tap';
import { startTestService, type TestService } from './service.js';
import { PG_URL } from './servers.js';

export interface WirePool {
  svc: TestService;
  sub: string;
  poolId: number;
  key: string;
  /** The owner's Control API token. */
  token: string;
  port: number;
  role: string;
  db: string;
  /** Superuser connection to the pool's database (to check what happened upstream). */
  direct: pg.Client;
  /** A libpq conninfo string through poolgate. */
  conninfo(extra?: Record<string, string>): string;
  /** node-postgres client config through poolgate. */
  clientConfig(extra?: Partial<pg.ClientConfig>): pg.ClientConfig;
  /** PATCH the pool's settings (max_concurrent and settings) and wait for the data plane to see them. */
  patch(body: { max_concurrent?: number; settings?: Record<string, unknown> }): Promise<void>;
  /** Server backends of the pool's role in its database. */
  backends(): Promise<number>;
  close(): Promise<void>;
}

export async function startWirePool(
  opts: { overrides?: Record<string, unknown>; maxConcurrent?: number; settings?: Record<string, unknown>; /** Where the pool reaches PostgreSQL (a proxy in front of it); 5432 by default. */ dbPort?: number; /** The service's clock (a TestClock's `now`). */ now?: () => Date } = {},
): Promise<WirePool> {
  const suffix = randomBytes(4).toString('hex');
  const role = `pgwire_role_${suffix}`;
  const db = `pgwire_db_${suffix}`;
  const password = `pw-${randomBytes(8).toString('hex')}`;
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  await admin.query(`CREATE ROLE ${role} LOGIN PASSWORD '${password}'`);
  await admin.query(`CREATE DATABASE ${db} OWNER ${role}`);
  const direct = new pg.Client({ connectionString: PG_URL.replace(/\/[^/]*$/, `/${db}`) });
  await direct.connect();

  const svc = await startTestService({ overrides: { dbAllowInsecure: true, accessLogFile: '/dev/null', ...opts.overrides }, now: opts.now });
  const boot = await svc.bootstrap();
  const created = await svc.api('POST', '/api/v1/pools/database', { token: boot.token, body: { db_host: '127.0.0.1', db_port: opts.dbPort ?? 5432, db_name: db } });
  if (created.status !== 201) throw new Error(`pool not created: ${JSON.stringify(created.body)}`);
  const sub: string = created.body.data.subdomain;
  const poolId: number = created.body.data.id;
  const attached = await svc.api('PUT', `/api/v1/pools/${sub}/credential`, { token: boot.token, body: { method: 'postgres_role', username: role, password } });
  if (attached.status !== 200) throw new Error(`credential not attached: ${JSON.stringify(attached.body)}`);
  const key: string = (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token: boot.token, body: { label: 'wire' } })).body.data.key;
  const dp = svc.service.dataplane!;
  const patch = async (body: { max_concurrent?: number; settings?: Record<string, unknown> }) => {
    const r = await svc.api('PATCH', `/api/v1/pools/${sub}/settings`, { token: boot.token, body });
    if (r.status !== 200) throw new Error(`settings not changed: ${JSON.stringify(r.body)}`);
    await dp.snapshots.reload();
  };
  if (opts.maxConcurrent !== undefined || opts.settings) await patch({ max_concurrent: opts.maxConcurrent, settings: opts.settings });
  await dp.snapshots.reload();
  const port = svc.service.ports.pg!;

  return {
    svc,
    sub,
    poolId,
    key,
    token: boot.token,
    port,
    role,
    db,
    direct,
    conninfo(extra = {}) {
      const kv: Record<string, string> = { host: '127.0.0.1', port: String(port), dbname: 'anything', user: 'anyone', options: `pool=${sub}`, password: key, sslmode: 'disable', connect_timeout: '20', ...extra };
      return Object.entries(kv)
        .map(([k, v]) => `${k}='${v.replace(/\\/g, '\\\\').replace(/'/g, "\\'")}'`)
        .join(' ');
    },
    clientConfig(extra = {}) {
      return { host: '127.0.0.1', port, database: 'anything', user: 'anyone', password: key, options: `pool=${sub}`, ...extra } as pg.ClientConfig;
    },
    patch,
    async backends() {
      const r = await direct.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1 AND datname = $2', [role, db]);
      return r.rows[0]!.n;
    },
    async close() {
      await svc.close();
      await direct.end().catch(() => {});
      await admin.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
      await admin.query(`DROP ROLE IF EXISTS ${role}`);
      await admin.end();
    },
  };
}

/** Runs a PostgreSQL client program (psql, pgbench) to completion with a time limit. */
export function runTool(cmd: string, args: string[], o: { input?: string; env?: Record<string, string>; timeoutMs?: number } = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env: { ...process.env, PGCONNECT_TIMEOUT: '20', ...o.env } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c));
    child.stderr.on('data', (c: Buffer) => (stderr += c));
    const timer = setTimeout(() => child.kill('SIGKILL'), o.timeoutMs ?? 90_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
    child.stdin.end(o.input ?? '');
  });
}

/** Asserts the listener holds nothing once its clients are gone: no client, no link, no busy server connection, no slot. */
export async function assertNothingHeld(t: Test, w: WirePool, maxServers?: number): Promise<void> {
  const listener = w.svc.service.pgWire!;
  const end = Date.now() + 20_000;
  while (Date.now() < end && (listener.counts().clients > 0 || listener.counts().linked > 0)) await new Promise((r) => setTimeout(r, 50));
  const c = listener.counts();
  t.equal(c.clients, 0, 'no client connection');
  t.equal(c.linked, 0, 'no linked server connection');
  t.equal(c.serversOpen, c.serversIdle, 'every open server connection is idle');
  if (maxServers !== undefined) t.ok(c.serversOpen <= maxServers, 'never more server connections than max_concurrent');
  t.equal(w.svc.service.dataplane!.governor.state(w.poolId).inFlight, 0, 'no slot held');
}

/** A TCP proxy in front of the local PostgreSQL whose server-to-client bytes can be held back, to delay the server's answers. */
export interface HoldProxy {
  port: number;
  /** From now on, what PostgreSQL sends is kept until release(). */
  hold(): void;
  /**
   * Passes bytes on again after sending what was kept, one answer (up to and including a ReadyForQuery) at a
   * time, `gapMs` apart: each reaches poolgate as its own read, as a busy server's answers do.
   */
  release(gapMs?: number): Promise<void>;
  close(): Promise<void>;
}

export async function startHoldProxy(targetPort = 5432): Promise<HoldProxy> {
  let holding = false;
  const kept: Array<[Socket, Buffer]> = [];
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    const upstream = tcpConnect({ host: '127.0.0.1', port: targetPort });
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('error', () => {});
      s.on('close', () => (client.destroy(), upstream.destroy()));
    }
    client.on('data', (c: Buffer) => upstream.write(c));
    upstream.on('data', (c: Buffer) => (holding ? kept.push([client, c]) : client.write(c)));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as { port: number }).port,
    hold() {
      holding = true;
    },
    async release(gapMs = 0) {
      // Held from a moment the connection was idle, so each socket's kept bytes start at a message boundary.
      const bySocket = new Map<Socket, Buffer>();
      for (const [s, c] of kept.splice(0)) bySocket.set(s, Buffer.concat([bySocket.get(s) ?? Buffer.alloc(0), c]));
      for (const [s, bytes] of bySocket) {
        let start = 0;
        let at = 0;
        while (at + 5 <= bytes.length) {
          const end = at + 1 + bytes.readInt32BE(at + 1);
          const ready = bytes[at] === 0x5a;
          at = end;
          if (!ready) continue;
          if (!s.destroyed) s.write(bytes.subarray(start, end));
          start = end;
          if (gapMs > 0) await new Promise((r) => setTimeout(r, gapMs));
        }
        if (start < bytes.length && !s.destroyed) s.write(bytes.subarray(start));
      }
      holding = false;
      for (const [s, c] of kept.splice(0)) if (!s.destroyed) s.write(c);
    },
    close() {
      for (const s of sockets) s.destroy();
      return new Promise((r) => server.close(() => r()));
    },
  };
}
