// Runs sysbench's oltp_read_only against a MySQL-protocol target and reads TPS, QPS and latency from its report.
import { execFile } from 'node:child_process';

/**
 * @param {{ host: string, port: number, user: string, password: string, database: string, tables: number, tableSize: number,
 *           threads?: number, duration?: number, events?: number, psMode?: 'auto' | 'disable', command?: 'prepare' | 'run' | 'cleanup' }} o
 */
export function sysbench(o) {
  const command = o.command ?? 'run';
  const args = ['oltp_read_only', '--db-driver=mysql', `--mysql-host=${o.host}`, `--mysql-port=${o.port}`, `--mysql-user=${o.user}`,
    `--mysql-password=${o.password}`, `--mysql-db=${o.database}`, `--tables=${o.tables}`, `--table-size=${o.tableSize}`,
    `--db-ps-mode=${o.psMode ?? 'auto'}`, '--mysql-ssl=off'];
  // events: exactly that many transactions, however long they take (a callgrind count), instead of a timed run.
  const limit = o.events ? [`--events=${o.events}`, '--time=0'] : [`--time=${o.duration ?? 10}`];
  if (command === 'run') args.push(`--threads=${o.threads ?? 16}`, ...limit, '--percentile=95', '--report-interval=0', '--db-debug=off');
  args.push(command);
  return new Promise((resolve) => {
    execFile('sysbench', args, { timeout: (o.events ? 1800 : (o.duration ?? 10) + 120) * 1000, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      if (command !== 'run') return resolve({ ok: !err, error: err ? `${err.message.split('\n')[0]} ${stdout.slice(-400)} ${stderr.slice(-400)}` : null });
      const num = (re) => Number(re.exec(stdout)?.[1] ?? NaN);
      const tps = num(/transactions:\s+\d+\s+\(([\d.]+) per sec/);
      const ok = !err && Number.isFinite(tps);
      resolve({
        ok,
        error: ok ? null : `${err?.message?.split('\n')[0] ?? 'no transactions line'}: ${(stdout + stderr).trim().split('\n').slice(-4).join(' | ')}`,
        tps: ok ? tps : null,
        transactions: ok ? num(/transactions:\s+(\d+)\s+\(/) : null,
        qps: ok ? num(/queries:\s+\d+\s+\(([\d.]+) per sec/) : null,
        errors: num(/ignored errors:\s+(\d+)/),
        latency_ms: ok ? { avg: num(/avg:\s+([\d.]+)/), p95: num(/95th percentile:\s+([\d.]+)/), max: num(/max:\s+([\d.]+)/) } : null,
      });
    });
  });
}
