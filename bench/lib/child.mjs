// Runs a helper server as a child process and waits for the JSON line with its port, so a server under
// test never shares an event loop with the load generator.
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { createInterface } from 'node:readline';

/**
 * @param {string} file  module to run with node
 * @param {string[]} args
 * @param {{ env?: Record<string,string>, nodeArgs?: string[], node?: string, pin?: string, wrap?: string[], startMs?: number }} [opts]  node: the node binary (default: this one);
 *   pin: a CPU list for `taskset -c` (the child and every thread it starts run only there)
 * @returns {Promise<{ port: number, pid: number, stop(): Promise<void> }>}
 */
export async function startChild(file, args = [], opts = {}) {
  const child = spawn(...pinned(opts.pin, opts.node ?? process.execPath, [...(opts.nodeArgs ?? []), file, ...args], opts.wrap), {
    env: { ...process.env, ...opts.env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (c) => (stderr = (stderr + c).slice(-4096)));
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${file} did not start within ${(opts.startMs ?? 30_000) / 1000} s\n${stderr}`)), opts.startMs ?? 30_000);
    createInterface({ input: child.stdout }).on('line', (line) => {
      try {
        const msg = JSON.parse(line);
        if (typeof msg.port === 'number') {
          clearTimeout(timer);
          resolve(msg.port);
        }
      } catch {
        /* not our line */
      }
    });
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`${file} exited (${code}) before listening\n${stderr}`));
    });
  });
  return {
    port,
    pid: child.pid,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
    },
  };
}

/** A free TCP port on 127.0.0.1 (bound and released at once; fine for a private bench server). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/**
 * [command, args] for spawn, run under `taskset -c <cpus>` when `cpus` is given. taskset execs the command, so
 * the child's pid is the command's own (CPU meters read the right process).
 */
export function pinned(cpus, command, args, wrap = []) {
  // wrap: a command line the child runs under (e.g. valgrind's, bench/instructions.mjs); it keeps the child's pid.
  const [cmd, ...rest] = [...wrap, command, ...args];
  return cpus ? ['taskset', ['-c', cpus, cmd, ...rest]] : [cmd, rest];
}
