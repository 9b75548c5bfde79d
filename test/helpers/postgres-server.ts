// A private PostgreSQL from the machine's initdb and pg_ctl, on a temp dir and a free loopback port, for tests
// that SIGKILL the store and start it again. As root, the server runs as the `postgres` user (initdb refuses root).
import { execFileSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from './redis-server.js';

export interface PostgresServer {
  url: string;
  /** SIGKILLs the postmaster (its backends exit with it). */
  kill(): void;
  start(): void;
  stop(): void;
}

function run(cmd: string, args: string[]): void {
  if (process.getuid?.() === 0) execFileSync('su', ['postgres', '-c', [cmd, ...args.map((a) => `'${a}'`)].join(' ')], { stdio: 'ignore' });
  else execFileSync(cmd, args, { stdio: 'ignore' });
}

export async function startPostgresServer(): Promise<PostgresServer> {
  // Under /tmp, not the test's private tmpdir: the `postgres` user must reach it (the private one is 0700).
  const dir = mkdtempSync(join(process.getuid?.() === 0 ? '/tmp' : tmpdir(), 'poolgate-pg-'));
  chmodSync(dir, 0o777);
  const data = join(dir, 'data');
  const port = await freePort();
  run('initdb', ['-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync']);
  const opts = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off`;
  const start = () => run('pg_ctl', ['-D', data, '-o', opts, '-l', join(dir, 'log'), '-w', 'start']);
  start();
  return {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    kill() {
      const pid = Number(readFileSync(join(data, 'postmaster.pid'), 'utf8').split('\n')[0]);
      process.kill(pid, 'SIGKILL');
    },
    start,
    stop() {
      try {
        run('pg_ctl', ['-D', data, '-m', 'immediate', 'stop']);
      } catch {
        /* already down */
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
