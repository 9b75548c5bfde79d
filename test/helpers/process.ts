// Runs poolgate as a child process and waits for the one `listening` JSON line it prints on stdout.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';

export interface Listening {
  child: ChildProcessWithoutNullStreams;
  /** The parsed `{"event":"listening", …ports}` line. */
  listening: Record<string, unknown>;
  /** Everything the child printed so far (stderr kept to its last 64 KiB). */
  output(): { stdout: string; stderr: string };
}

/** Spawns `process.execPath argv…` and resolves at its first stdout line; rejects if it exits or times out first. */
export async function spawnListening(argv: string[], opts: { cwd: string; env: NodeJS.ProcessEnv; timeoutMs?: number; name?: string }): Promise<Listening> {
  const child = spawn(process.execPath, argv, { cwd: opts.cwd, env: opts.env });
  const name = opts.name ?? argv.join(' ');
  const timeoutMs = opts.timeoutMs ?? 30_000;
  let stdout = '';
  let stderr = '';
  child.stderr.on('data', (c: Buffer) => (stderr = (stderr + c).slice(-65536)));
  const line = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name}: no listening line within ${timeoutMs / 1000} s; stderr: ${stderr}`)), timeoutMs);
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
