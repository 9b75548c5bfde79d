// The running process that holds the embedded store answers admin commands on a unix socket in the
// data dir, so `poolgate admin …` works while `poolgate start` runs (PGlite allows one process).
import { createConnection, createServer, type Server } from 'node:net';
import { chmodSync, existsSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { runAdmin, type AdminDeps, type AdminResult } from './commands.js';

export interface AdminSocket {
  readonly path: string;
  close(): Promise<void>;
}

const MAX_REQUEST = 64 * 1024;

export const adminSocketPath = (dataDir: string): string => join(dataDir, 'admin.sock');

export async function startAdminSocket(dataDir: string, deps: AdminDeps): Promise<AdminSocket> {
  const path = adminSocketPath(dataDir);
  if (existsSync(path)) unlinkSync(path); // left by a process that died; the data-dir lock says we own it now
  const server: Server = createServer((conn) => {
    let buf = '';
    conn.setEncoding('utf8');
    conn.on('error', () => conn.destroy());
    conn.on('data', (chunk: string) => {
      buf += chunk;
      if (buf.length > MAX_REQUEST) return conn.destroy();
      const nl = buf.indexOf('\n');
      if (nl < 0) return;
      conn.removeAllListeners('data');
      let argv: unknown;
      try {
        argv = (JSON.parse(buf.slice(0, nl)) as { argv?: unknown }).argv;
      } catch {
        argv = null;
      }
      const run: Promise<AdminResult> =
        Array.isArray(argv) && argv.every((a) => typeof a === 'string')
          ? runAdmin(argv as string[], deps)
          : Promise.resolve({ code: 2, stdout: '', stderr: 'bad admin request\n' });
      void run.then((res) => conn.end(JSON.stringify(res) + '\n'));
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(path, () => resolve());
  });
  chmodSync(path, 0o600);
  return {
    path,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        if (existsSync(path)) unlinkSync(path);
      }),
  };
}

/** Sends argv to the running process; null when no process answers on the socket. */
export function forwardAdmin(dataDir: string, argv: readonly string[]): Promise<AdminResult | null> {
  const path = adminSocketPath(dataDir);
  if (!existsSync(path)) return Promise.resolve(null);
  return new Promise((resolve) => {
    let buf = '';
    let connected = false;
    const conn = createConnection(path, () => {
      connected = true;
      conn.write(JSON.stringify({ argv }) + '\n');
    });
    conn.setEncoding('utf8');
    conn.on('data', (c: string) => (buf += c));
    conn.on('error', () => resolve(connected ? { code: 1, stdout: '', stderr: 'the running poolgate closed the admin socket\n' } : null));
    conn.on('end', () => {
      try {
        resolve(JSON.parse(buf) as AdminResult);
      } catch {
        resolve({ code: 1, stdout: '', stderr: 'bad answer on the admin socket\n' });
      }
    });
  });
}
