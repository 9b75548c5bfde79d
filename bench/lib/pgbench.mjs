// Runs pgbench (a select-only or read-write script) against one target and reduces its per-transaction log
// to TPS and latency average / p50 / p95 / p99.
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * @param {{ host: string, port: number, user: string, password?: string, database: string, options?: string,
 *           args: string[], clients: number, threads: number, duration: number }} o
 */
export function pgbench(o) {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-pgbench-'));
  const args = ['-h', o.host, '-p', String(o.port), '-U', o.user, '-n', '-c', String(o.clients), '-j', String(o.threads),
    '-T', String(o.duration), '-l', `--log-prefix=${join(dir, 'tx')}`, ...o.args, o.database];
  const env = { ...process.env, PGPASSWORD: o.password ?? '', PGOPTIONS: o.options ?? '', PGCONNECT_TIMEOUT: '10', PGSSLMODE: 'disable' };
  return new Promise((resolve) => {
    execFile('pgbench', args, { env, timeout: (o.duration + 60) * 1000, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      const tps = Number(/tps = ([\d.]+) \(without initial connection time\)/.exec(stdout)?.[1] ?? NaN);
      const failed = Number(/number of failed transactions: (\d+)/.exec(stdout)?.[1] ?? 0);
      const processed = Number(/number of transactions actually processed: (\d+)/.exec(stdout)?.[1] ?? 0);
      const lat = latencies(dir);
      rmSync(dir, { recursive: true, force: true });
      const ok = !err && Number.isFinite(tps);
      resolve({
        ok,
        error: ok ? null : `${err?.message?.split('\n')[0] ?? 'no tps line'}: ${stderr.trim().split('\n').slice(-3).join(' | ')}`,
        tps: ok ? round(tps) : null,
        transactions: processed,
        failed,
        latency_ms: lat,
      });
    });
  });
}

/** Per-transaction latencies (µs, third column of each `-l` line) from every log file in dir. */
function latencies(dir) {
  const all = [];
  for (const f of readdirSync(dir)) {
    for (const line of readFileSync(join(dir, f), 'utf8').split('\n')) {
      const us = Number(line.split(' ')[2]);
      if (Number.isFinite(us) && line) all.push(us);
    }
  }
  if (!all.length) return null;
  const sorted = Float64Array.from(all).sort();
  const q = (p) => round(sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] / 1000, 3);
  return { avg: round(all.reduce((a, b) => a + b, 0) / all.length / 1000, 3), p50: q(0.5), p95: q(0.95), p99: q(0.99) };
}

const round = (n, d = 1) => Math.round(n * 10 ** d) / 10 ** d;
