// Runs poolgate as a child process and waits for the one `listening` JSON line it prints on stdout.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fromRoot } from '../../src/config/paths.js';

/** bin/poolgate.js, the file `npx poolgate` runs. */
export const BIN = fromRoot('bin', 'poolgate.js');

/**
 * The node arguments that run the binary as an operator's shell does: its shebang's V8 flags, then the file.
 * `node bin/poolgate.js` alone would leave out `--liftoff-only`, and every child that opens the embedded store
 * would spend ~0.7 s of CPU recompiling PGlite's WebAssembly in TurboFan, which no operator's process does.
 */
export function binArgv(...args: string[]): string[] {
  return [...SHEBANG_FLAGS, BIN, ...args];
}

// `#!/usr/bin/env -S node --flag …`: the words after `node`.
const SHEBANG_FLAGS: string[] = (() => {
  const first = readFileSync(BIN, 'utf8').split('\n', 1)[0]!;
  const words = first.replace(/^#!/, '').trim().split(/\s+/);
  const node = words.indexOf('node');
  if (node < 0) throw new Error(`bin/poolgate.js: no node in its shebang (${first})`);
  return words.slice(node + 1);
})();

export interface Listening {
  child: ChildProcessWithoutNullStreams;
  /** The parsed `{"event":"listening", …ports}` line. */
  listening: Record<string, unknown>;
  /** Everything the child printed so far (stderr kept to its last 64 KiB). */
  output(): { stdout: string; stderr: string };
}

/** Spawns `process.execPath argv…` and resolves at its first stdout line; rejects if it exits or times out first (killing it). */
export async function spawnListening(argv: string[], opts: { cwd: string; env: NodeJS.ProcessEnv; timeoutMs?: number; name?: string }): Promise<Listening> {
  const child = spawn(process.execPath, argv, { cwd: opts.cwd, env: opts.env });
  const name = opts.name ?? argv.join(' ');
  const timeoutMs = opts.timeoutMs ?? 30_000;
  let stdout = '';
  let stderr = '';
  child.stderr.on('data', (c: Buffer) => (stderr = (stderr + c).slice(-65536)));
  const line = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => {
      // The caller never gets the child: left running, it would outlive the test and keep its ports.
      child.kill('SIGKILL');
      reject(new Error(`${name}: no listening line within ${timeoutMs / 1000} s; stderr: ${stderr}`));
    }, timeoutMs);
    child.stdout.on('data', (c: Buffer) => {
      stdout += c;
      const nl = stdout.indexOf('\n');
      if (nl >= 0) {
        clearTimeout(timer);
        resolve(stdout.slice(0, nl));
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited (${code}) before listening: ${stderr}`));
    });
  });
  return { child, listening: JSON.parse(line) as Record<string, unknown>, output: () => ({ stdout, stderr }) };
}
