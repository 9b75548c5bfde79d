// A private PostgreSQL from the machine's initdb and pg_ctl, on a temp dir and a free loopback port, for tests
// that SIGKILL the store and start it again. As root, the server runs as the `postgres` user (initdb refuses root).
import { execFile, execFileSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from './redis-server.js';

export interface PostgresServer {
  url: string;
  /** SIGKILLs the postmaster (its backends exit with it). */
  kill(): void;
  start(): Promise<void>;
  stop(): void;
}

function command(cmd: string, args: string[]): [string, string[]] {
  return process.getuid?.() === 0 ? ['su', ['postgres', '-c', [cmd, ...args.map((a) => `'${a}'`)].join(' ')]] : [cmd, args];
}

function run(cmd: string, args: string[]): void {
  const [file, argv] = command(cmd, args);
  execFileSync(file, argv, { stdio: 'ignore' });
}

/** Without blocking this process's event loop (a service under test runs in it). */
function runAsync(cmd: string, args: string[]): Promise<void> {
  const [file, argv] = command(cmd, args);
  return new Promise((resolve, reject) => execFile(file, argv, (err) => (err ? reject(err) : resolve())));
}

export async function startPostgresServer(): Promise<PostgresServer> {
  // Under /tmp, not the test's private tmpdir: the `postgres` user must reach it (the private one is 0700).
  const dir = mkdtempSync(join(process.getuid?.() === 0 ? '/tmp' : tmpdir(), 'poolgate-pg-'));
  chmodSync(dir, 0o777);
  const data = join(dir, 'data');
  const port = await freePort();
  run('initdb', ['-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync']);
  const opts = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off`;
  const pgStart = ['-D', data, '-o', opts, '-l', join(dir, 'log'), '-w', 'start'];
  run('pg_ctl', pgStart);
  /**
   * Starts it again after kill(): the killed postmaster's backends hold its shared memory until each notices
   * it is gone (an idle one at once, a busy one after its statement), and a new postmaster refuses to start
   * until then, as it would for an operator's restart: retried for up to 15 s.
   */
  const start = async () => {
    for (let attempt = 1; ; attempt++) {
      try {
        return await runAsync('pg_ctl', pgStart);
      } catch (err) {
        if (attempt >= 30) throw err;
        await new Promise((r) => setTimeout(r, 500));
      }
    }
  };
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
