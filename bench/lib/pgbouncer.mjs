// Starts a private PgBouncer (transaction pooling, or session pooling where asked, one database entry, md5 client auth from a plain auth file)
// on a free loopback port, run as the postgres OS user because PgBouncer refuses to run as root.
import { spawn, execFileSync } from 'node:child_process';
import { chownSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createConnection } from 'node:net';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { freePort } from './child.mjs';

function reachable(port) {
  return new Promise((resolve) => {
    const s = createConnection({ host: '127.0.0.1', port });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

/**
 * @param {{ upstream: { host: string, port: number, database: string, user: string }, alias: string, user: string,
 *           password: string, poolSize: number, maxClients?: number, poolMode?: 'transaction' | 'session' }} o
 */
export async function startPgbouncer(o) {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-pgbouncer-'));
  const port = await freePort();
  const ini = join(dir, 'pgbouncer.ini');
  writeFileSync(join(dir, 'users.txt'), `"${o.user}" "${o.password}"\n`);
  writeFileSync(ini, [
    '[databases]',
    `${o.alias} = host=${o.upstream.host} port=${o.upstream.port} dbname=${o.upstream.database} user=${o.upstream.user}`,
    '[pgbouncer]',
    'listen_addr = 127.0.0.1',
    `listen_port = ${port}`,
    'unix_socket_dir =',
    'auth_type = md5',
    `auth_file = ${join(dir, 'users.txt')}`,
    `pool_mode = ${o.poolMode ?? 'transaction'}`,
    `default_pool_size = ${o.poolSize}`,
    'min_pool_size = 0',
    'reserve_pool_size = 0',
    `max_client_conn = ${o.maxClients ?? 500}`,
    `max_db_connections = ${o.poolSize}`,
    'ignore_startup_parameters = extra_float_digits,options',
    `logfile = ${join(dir, 'pgbouncer.log')}`,
    `pidfile = ${join(dir, 'pgbouncer.pid')}`,
    'log_connections = 0',
    'log_disconnections = 0',
    'stats_period = 3600',
    '',
  ].join('\n'));
  const asRoot = userInfo().uid === 0;
  if (asRoot) {
    const uid = Number(execFileSync('id', ['-u', 'postgres']).toString().trim());
    const gid = Number(execFileSync('id', ['-g', 'postgres']).toString().trim());
    for (const f of [dir, ini, join(dir, 'users.txt')]) chownSync(f, uid, gid);
  }
  const child = asRoot ? spawn('runuser', ['-u', 'postgres', '--', 'pgbouncer', ini], { stdio: 'ignore' }) : spawn('pgbouncer', [ini], { stdio: 'ignore' });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  for (let i = 0; !(await reachable(port)); i++) {
    if (i > 100 || child.exitCode !== null) throw new Error(`pgbouncer did not listen on ${port} (see ${dir}/pgbouncer.log)`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const version = execFileSync('pgbouncer', ['--version']).toString().split('\n')[0].trim();
  return {
    port,
    // PgBouncer's own pid (the spawned child may be runuser), for its CPU time.
    pid: Number(readFileSync(join(dir, 'pgbouncer.pid'), 'utf8').trim()) || child.pid,
    version,
    settings: { pool_mode: o.poolMode ?? 'transaction', default_pool_size: o.poolSize, auth_type: 'md5 (client), trust (server)' },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
