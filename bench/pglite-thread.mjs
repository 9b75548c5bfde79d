// What moving the embedded store (PGlite) off the data plane's thread would cost (issue 29's tail): the same
// store opened on the main thread or in a worker thread (one process each, `npm start`'s V8 flags), the same
// read-only statement run N times one after the other; per statement, the main thread's CPU time
// (process.threadCpuUsage: what the event loop that serves pool traffic would spend), the process's CPU time and
// the wall time; and the resident set idle after the open. Rounds alternate the two modes.
// Usage: npm run build && node bench/pglite-thread.mjs [rounds=3] [statements=2000]
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';

/** A statement of the kind the periodic work runs: an EXISTS probe and a count. */
const STATEMENT = `SELECT EXISTS (SELECT 1 FROM jobs WHERE status = 'queued' AND expires_at <= now()) AS a, (SELECT count(*) FROM pools) AS n`;
const self = fileURLToPath(import.meta.url);

async function open(dir) {
  const { PGlite } = await import('@electric-sql/pglite');
  return PGlite.create(dir, { startParams: [...PGlite.defaultStartParams, '-c', 'shared_buffers=32MB'] });
}

const rssMb = () => Math.round(Number(/^VmRSS:\s+(\d+)/m.exec(readFileSync('/proc/self/status', 'utf8'))[1]) / 1024);

/** One mode in this process: prints one JSON line. */
async function measure(mode, dir, n) {
  let query;
  if (mode === 'main') {
    const db = await open(dir);
    query = () => db.query(STATEMENT);
  } else {
    const w = new Worker(self, { workerData: { dir } });
    await new Promise((r) => w.once('message', r));
    let next = 0;
    const waiting = new Map();
    w.on('message', (m) => {
      waiting.get(m.id)(m);
      waiting.delete(m.id);
    });
    query = () => new Promise((resolve) => {
      const id = next++;
      waiting.set(id, resolve);
      w.postMessage({ id });
    });
  }
  for (let i = 0; i < 200; i++) await query();
  await new Promise((r) => setTimeout(r, 5000));
  const rssIdle = rssMb();
  const [t0, cpu0, th0] = [performance.now(), process.cpuUsage(), process.threadCpuUsage()];
  for (let i = 0; i < n; i++) await query();
  const [wall, cpu, th] = [performance.now() - t0, process.cpuUsage(cpu0), process.threadCpuUsage(th0)];
  const us = (v) => Math.round(v / n);
  console.log(JSON.stringify({ mode, rss_idle_mb: rssIdle, main_thread_cpu_us: us(th.user + th.system), process_cpu_us: us(cpu.user + cpu.system), wall_us: us(wall * 1000) }));
  process.exit(0);
}

if (!isMainThread) {
  const db = await open(workerData.dir);
  parentPort.on('message', async (m) => {
    const r = await db.query(STATEMENT);
    parentPort.postMessage({ id: m.id, rows: r.rows });
  });
  parentPort.postMessage('ready');
} else if (process.argv[2] === '--mode') {
  await measure(process.argv[3], process.argv[4], Number(process.argv[5]));
} else {
  const rounds = Number(process.argv[2] ?? 3);
  const n = Number(process.argv[3] ?? 2000);
  const dataDir = mkdtempSync(join(tmpdir(), 'poolgate-bench-pglite-thread-'));
  try {
    const { openStore } = await import('../dist/src/store/open.js');
    await (await openStore({ dataDir, databaseUrl: null })).close();
    const flags = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')).scripts.start.split(' ').filter((a) => a.startsWith('--'));
    for (let round = 1; round <= rounds; round++) {
      for (const mode of round % 2 ? ['main', 'worker'] : ['worker', 'main']) {
        const out = execFileSync(process.execPath, [...flags, self, '--mode', mode, join(dataDir, 'pglite'), String(n)], { encoding: 'utf8' });
        process.stdout.write(out.replace('{', `{"round":${round},`));
      }
    }
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
}
