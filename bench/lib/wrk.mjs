// wrk (C load generator) as a second opinion beside autocannon: installed with apt-get when missing (when
// that fails the runs are skipped), run once per measurement, its text report parsed into the same figures.
import { execFile, execFileSync } from 'node:child_process';

/** Whether wrk can be run, installing it once if allowed. */
export function ensureTool(bin, pkg, log) {
  const has = () => {
    try {
      execFileSync('sh', ['-c', `command -v ${bin}`], { stdio: 'ignore' });
      return true;
    } catch {
      return false;
    }
  };
  if (has()) return true;
  log(`${bin} is missing: apt-get install -y ${pkg}`);
  try {
    execFileSync('apt-get', ['install', '-y', pkg], { stdio: 'ignore', env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' }, timeout: 300_000 });
  } catch (err) {
    log(`apt-get install ${pkg} failed: ${String(err.message).split('\n')[0]}`);
  }
  return has();
}

const UNIT_MS = { us: 0.001, ms: 1, s: 1000, m: 60_000 };

function toMs(text) {
  const m = /^([\d.]+)(us|ms|s|m)$/.exec(text);
  return m ? Math.round(Number(m[1]) * UNIT_MS[m[2]] * 1000) / 1000 : null;
}

/**
 * Several URLs (one port per data plane thread): one wrk per URL at the same time, the connections split
 * between them; requests and rps add up, each latency percentile is the worst of the runs (an upper bound).
 * @param {{ name: string, url: string, urls?: string[], headers?: Record<string,string>, duration: number, connections: number }} spec
 */
export async function wrkSpread(spec) {
  if (!spec.urls || spec.urls.length < 2) return wrk(spec);
  const n = spec.urls.length;
  const runs = await Promise.all(spec.urls.map((url) => wrk({ ...spec, url, connections: Math.max(1, Math.round(spec.connections / n)), threads: 1 })));
  const worst = (k) => (runs.some((r) => r.latency_ms[k] === null) ? null : Math.max(...runs.map((r) => r.latency_ms[k])));
  const sum = (k) => runs.reduce((a, r) => a + r[k], 0);
  return { ...runs[0], requests: sum('requests'), rps: Math.round(sum('rps') * 10) / 10, latency_ms: { p50: worst('p50'), p99: worst('p99') }, non2xx: sum('non2xx'), errors: sum('errors'), connections: spec.connections };
}

/**
 * @param {{ name: string, url: string, headers?: Record<string,string>, duration: number, connections: number, threads?: number }} spec
 */
export function wrk(spec) {
  const threads = Math.min(spec.threads ?? 2, spec.connections);
  const args = ['--latency', `-t${threads}`, `-c${spec.connections}`, `-d${spec.duration}s`];
  // wrk adds its own `Host` unless given one spelt exactly so: a lowercase `host` would be sent twice.
  for (const [k, v] of Object.entries(spec.headers ?? {})) args.push('-H', `${k.replace(/(^|-)([a-z])/g, (_, d, c) => d + c.toUpperCase())}: ${v}`);
  args.push(spec.url);
  return new Promise((resolve, reject) => {
    execFile('wrk', args, { timeout: (spec.duration + 30) * 1000 }, (err, stdout) => {
      if (err) return reject(new Error(`wrk failed: ${err.message}`));
      const pct = (p) => {
        const m = new RegExp(`^\\s+${p}%\\s+(\\S+)`, 'm').exec(stdout);
        return m ? toMs(m[1]) : null;
      };
      const num = (re) => {
        const m = re.exec(stdout);
        return m ? Number(m[1]) : 0;
      };
      const socketErrors = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(stdout);
      resolve({
        name: spec.name,
        tool: 'wrk',
        requests: num(/(\d+) requests in/),
        rps: Math.round(num(/Requests\/sec:\s+([\d.]+)/) * 10) / 10,
        latency_ms: { p50: pct(50), p99: pct(99) },
        non2xx: num(/Non-2xx or 3xx responses: (\d+)/),
        errors: socketErrors ? socketErrors.slice(1).reduce((a, b) => a + Number(b), 0) : 0,
        connections: spec.connections,
        duration_s: spec.duration,
      });
    });
  });
}
