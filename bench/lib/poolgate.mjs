// Starts the real CLI (`node bin/poolgate.js start`) as a child process and runs `poolgate admin …` next to it.
import { spawn, execFile } from 'node:child_process';
import { appendFileSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { pinned } from './child.mjs';

export const root = fileURLToPath(new URL('../..', import.meta.url));
const BIN = join(root, 'bin', 'poolgate.js');
/** The V8 flags of poolgate's start command, read from package.json's `start` script. */
const RUNTIME_FLAGS = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).scripts.start.split(' ').filter((a) => a.startsWith('--'));

/**
 * Starts poolgate on free ports with a fresh data dir. Resolves once its `listening` line is printed.
 * @param {Record<string, string>} extraEnv
 * @param {{ nodeArgs?: string[], bin?: string, node?: string, pin?: string, wrap?: string[], startMs?: number }} [opts]  nodeArgs e.g. `--cpu-prof` (not allowed in NODE_OPTIONS);
 *   bin: another build's bin/poolgate.js (a before/after comparison in one run); node: the node binary (default: this one);
 *   pin: a CPU list for `taskset -c` (every thread of the service runs only there); wrap: a command line it runs under (valgrind); startMs: how long start-up may take (default 120 s)
 */
export async function startPoolgate(extraEnv = {}, opts = {}) {
  const dataDir = mkdtempSync(join(tmpdir(), 'poolgate-bench-'));
  const env = {
    ...process.env,
    POOLGATE_CONFIG: '',
    POOLGATE_HOST: '127.0.0.1',
    POOLGATE_CONTROL_PORT: '0',
    POOLGATE_PROXY_PORT: '0',
    POOLGATE_LOCK_PORT: '0',
    POOLGATE_METRICS_PORT: '0',
    POOLGATE_PG_PORT: '0',
    POOLGATE_MYSQL_PORT: '0',
    POOLGATE_DATA_DIR: dataDir,
    DATABASE_URL: '',
    REDIS_URL: '',
    ...extraEnv,
  };
  // An empty POOLGATE_CONFIG would be read as a file name; drop it unless the caller set one.
  if (!env.POOLGATE_CONFIG) delete env.POOLGATE_CONFIG;
  // As `npm start` and the bin's shebang run it (docs/runtime.md).
  const node = opts.node ?? process.execPath;
  const child = spawn(...pinned(opts.pin, node, [...RUNTIME_FLAGS, ...(opts.nodeArgs ?? []), opts.bin ?? BIN, 'start'], opts.wrap), { cwd: root, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (chunk) => {
    // Keep the tail for error messages; the service log is not the benchmark's business.
    stderr = (stderr + chunk).slice(-8192);
    if (process.env.BENCH_CHILD_STDERR) appendFileSync(process.env.BENCH_CHILD_STDERR, chunk);
  });
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));

  const listening = await new Promise((resolve, reject) => {
    // Under valgrind (wrap) start-up is ~50× slower: on a loaded machine it took over two minutes (opts.startMs overrides).
    const startMs = opts.startMs ?? (opts.wrap ? 600_000 : 120_000);
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`poolgate did not print its listening line within ${startMs / 1000} s (a busy machine)\n${stderr}`));
    }, startMs);
    const lines = createInterface({ input: child.stdout });
    lines.on('line', (line) => {
      if (process.env.BENCH_CHILD_STDOUT) appendFileSync(process.env.BENCH_CHILD_STDOUT, `${line}\n`);
      try {
        const msg = JSON.parse(line);
        if (msg.event === 'listening') {
          clearTimeout(timer);
          resolve(msg);
        }
      } catch {
        /* not a JSON line */
      }
    });
    void exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`poolgate exited (${code ?? signal}) before listening\n${stderr}`));
    });
  });

  return {
    listening,
    controlUrl: `http://127.0.0.1:${listening.control}`,
    dataDir,
    pid: child.pid,
    /** Runs `poolgate admin …` (forwarded to this process over its admin socket) and parses its JSON output. */
    admin(argv) {
      return new Promise((resolve, reject) => {
        execFile(node, [opts.bin ?? BIN, 'admin', ...argv], { cwd: root, env }, (err, stdout, errOut) => {
          if (err) return reject(new Error(`poolgate admin ${argv.join(' ')} failed: ${errOut || err.message}`));
          try {
            resolve(JSON.parse(stdout));
          } catch {
            reject(new Error(`poolgate admin ${argv.join(' ')} printed no JSON: ${stdout}`));
          }
        });
      });
    },
    /** SIGTERM, wait for the drain, remove the data dir. */
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      const done = await exited;
      rmSync(dataDir, { recursive: true, force: true });
      return done;
    },
  };
}

/** One JSON request to the Control API. */
export async function api(baseUrl, token, method, path, body) {
  const res = await fetch(baseUrl + path, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: res.status, body: json ?? text };
}

/** A Control API caller for one token whose every call must answer `want` (else it throws); returns `data`. */
export function apiCaller(baseUrl, token) {
  return async (method, path, body, want) => {
    const res = await api(baseUrl, token, method, path, body);
    if (res.status !== want) throw new Error(`${method} ${path} → ${res.status} ${JSON.stringify(res.body)}`);
    return res.body.data;
  };
}
