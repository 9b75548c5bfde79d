// Instructions per pgbench transaction through poolgate's PostgreSQL listener, under valgrind's callgrind (issue
// 30): the counterpart of bench/instructions.mjs for the wire listener. Instruction counts do not depend on what
// else the machine runs, so a change's before/after is repeatable on the shared 2-core box where TPS swings by
// ±0.2. poolgate (max_concurrent 8, transaction mode, adaptive off, as bench:db) and optionally the bare Node.js
// relay (bench/lib/pg-relay.mjs) and another build each run under callgrind; per workload a warm-up, counters
// zeroed, `pgbench -c 8 -j 2 -t N`, a dump: the process's Ir (every thread) over the transactions. The idle
// process's rate (timers, snapshot resync, polls) is measured first and shown subtracted as "busy".
// They are not time: syscalls' kernel work is left out, and under callgrind pgbench's transactions batch less.
// Usage: npm run build && node bench/db-instructions.mjs [--transactions=500] [--warmup=1000] [--perf-map] [--idle=10]
//   [--workloads='-S;-S -M prepared;TPC-B'] [--targets=poolgate,node-relay,poolgate_before] [--before=<built checkout>] [--keep=<dir>]
import { execFile, execFileSync } from 'node:child_process';
import { promisify } from 'node:util';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { apiCaller, root, startPoolgate } from './lib/poolgate.mjs';
import { startChild } from './lib/child.mjs';
import { callgrindControl, callgrindWrap, dumpIr } from './lib/callgrind.mjs';

const arg = (name, def) => process.argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? def;
const TXNS = Number(arg('transactions', 500));
const WARMUP = Number(arg('warmup', 1000));
const IDLE_S = Number(arg('idle', 10));
const BEFORE = arg('before', null);
const KEEP = arg('keep', null);
// --perf-map: V8 writes /tmp/perf-<pid>.map, which names the JIT code addresses in the kept callgrind dumps.
const NODE_ARGS = process.argv.includes('--perf-map') ? ['--perf-basic-prof'] : [];
const TARGETS = arg('targets', BEFORE ? 'poolgate_before,poolgate' : 'poolgate').split(',');
const WORKLOADS = arg('workloads', '-S;-S -M prepared').split(';');
const CLIENTS = 8;
const PG = { host: '127.0.0.1', port: 5432, admin: 'postgres' };
const ROLE = `bench_dbi_${randomBytes(3).toString('hex')}`;
const PASSWORD = randomBytes(12).toString('hex');
const execFileP = promisify(execFile);
const log = (m) => process.stderr.write(`[db-instructions] ${m}\n`);
const WORKLOAD_ARGS = { '-S': ['-S'], '-S -M prepared': ['-S', '-M', 'prepared'], 'TPC-B': [], 'select-only, extended': ['-S', '-M', 'extended'] };

async function poolgateTarget(dir, wrap, bin) {
  const svc = await startPoolgate({ POOLGATE_ALLOW_PRIVATE_TARGETS: 'true', POOLGATE_DB_ALLOW_INSECURE: 'true', POOLGATE_LOG_LEVEL: 'warn', POOLGATE_ACCESS_LOG_FILE: join(dir, `access-${randomBytes(3).toString('hex')}.log`) }, { wrap, bin, nodeArgs: NODE_ARGS });
  const boot = await svc.admin(['bootstrap', '--team', 'Bench', '--email', 'bench@bench.test', '--plan', 'business']);
  const call = apiCaller(svc.controlUrl, boot.token);
  const pool = await call('POST', '/api/v1/pools/database', { db_host: 'localhost', db_port: PG.port, db_name: ROLE, name: 'bench-postgres' }, 201);
  await call('PUT', `/api/v1/pools/${pool.subdomain}/credential`, { method: 'postgres_role', username: ROLE, password: PASSWORD }, 200);
  await call('PATCH', `/api/v1/pools/${pool.subdomain}/settings`, { max_concurrent: CLIENTS, settings: { adaptive: false } }, 200);
  const minted = await call('POST', `/api/v1/pools/${pool.subdomain}/keys`, { label: 'bench' }, 201);
  return { pid: svc.pid, stop: () => svc.stop(), conn: { host: '127.0.0.1', port: svc.listening.pg, user: ROLE, password: minted.key, database: ROLE, options: `pool=${pool.subdomain}` } };
}

async function relayTarget(wrap) {
  const relay = await startChild(join(root, 'bench/lib/pg-relay.mjs'), [PG.host, String(PG.port)], { wrap, startMs: 180_000 });
  return { pid: relay.pid, stop: () => relay.stop(), conn: { host: '127.0.0.1', port: relay.port, user: ROLE, password: PASSWORD, database: ROLE } };
}

async function ready(conn) {
  let last;
  for (let i = 0; i < 300; i++) {
    const c = new pg.Client({ ...conn, connectionTimeoutMillis: 20_000 });
    try {
      await c.connect();
      await c.query('select 1');
      await c.end();
      return;
    } catch (err) {
      last = err;
      await c.end().catch(() => {});
      await new Promise((r) => setTimeout(r, 500));
    }
  }
  throw new Error(`no query got through: ${last?.message}`);
}

/** pgbench with exactly `t` transactions per client; throws unless all ran. */
async function run(conn, workload, t, clients = CLIENTS) {
  const args = ['-h', conn.host, '-p', String(conn.port), '-U', conn.user, '-n', '-c', String(clients), '-j', String(Math.min(2, clients)), '-t', String(t), ...WORKLOAD_ARGS[workload], conn.database];
  const env = { ...process.env, PGPASSWORD: conn.password, PGOPTIONS: conn.options ?? '', PGSSLMODE: 'disable' };
  const { stdout } = await execFileP('pgbench', args, { env, timeout: 1_800_000 });
  const n = Number(/number of transactions actually processed: (\d+)/.exec(stdout)?.[1] ?? 0);
  if (n !== clients * t) throw new Error(`pgbench ${workload}: ${n}/${clients * t} transactions\n${stdout}`);
  return n;
}

async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-dbi-'));
  const cgDir = join(dir, 'cg');
  execFileSync('mkdir', ['-p', cgDir]);
  const wrap = callgrindWrap(cgDir);
  const admin = new pg.Client({ host: PG.host, port: PG.port, user: PG.admin, database: 'postgres' });
  await admin.connect();
  await admin.query(`CREATE ROLE ${ROLE} LOGIN PASSWORD '${PASSWORD}'`);
  await admin.query(`CREATE DATABASE ${ROLE} OWNER ${ROLE}`);
  execFileSync('pgbench', ['-h', PG.host, '-p', String(PG.port), '-U', ROLE, '-i', '-q', '-s', '1', ROLE], { env: { ...process.env, PGPASSWORD: PASSWORD }, stdio: 'ignore' });
  const rows = [];
  try {
    for (const key of TARGETS) {
      const t0 = Date.now();
      const target = key === 'poolgate' ? await poolgateTarget(dir, wrap)
        : key === 'poolgate_before' ? await poolgateTarget(dir, wrap, join(BEFORE, 'bin', 'poolgate.js'))
        : key === 'node-relay' ? await relayTarget(wrap)
        : null;
      if (!target) throw new Error(`unknown target ${key}`);
      try {
        await ready(target.conn);
        log(`${key} up under valgrind in ${((Date.now() - t0) / 1000).toFixed(0)} s (pid ${target.pid})`);
        callgrindControl(target.pid, '-i', 'on');
        callgrindControl(target.pid, '-z');
        const i0 = Date.now();
        await new Promise((r) => setTimeout(r, IDLE_S * 1000));
        const idlePerS = dumpIr(cgDir, target.pid, KEEP) / ((Date.now() - i0) / 1000);
        // Server connections opened a few at a time: eight logins at once under valgrind can outlast the
        // listener's 10 s connect timeout on a loaded machine.
        for (const c of [2, 4]) await run(target.conn, WORKLOADS[0], 10, c);
        for (const w of WORKLOADS) {
          await run(target.conn, w, WARMUP);
          callgrindControl(target.pid, '-z');
          const t1 = Date.now();
          const n = await run(target.conn, w, TXNS);
          const ir = dumpIr(cgDir, target.pid, KEEP);
          const seconds = (Date.now() - t1) / 1000;
          const idle = Math.round(idlePerS * seconds);
          const row = { target: key, workload: w, transactions: n, ir_per_txn: Math.round(ir / n), busy_ir_per_txn: Math.round((ir - idle) / n), seconds };
          rows.push(row);
          log(`${key} ${w}: ${row.ir_per_txn} instructions per transaction, ${row.busy_ir_per_txn} less the idle process's (${n} in ${seconds} s)`);
        }
      } finally {
        await target.stop();
      }
    }
  } finally {
    await admin.query(`DROP DATABASE IF EXISTS ${ROLE} WITH (FORCE)`).catch(() => {});
    await admin.query(`DROP ROLE IF EXISTS ${ROLE}`).catch(() => {});
    await admin.end();
    rmSync(dir, { recursive: true, force: true });
  }
  console.log(JSON.stringify({ date: new Date().toISOString(), node: process.version, transactions_per_client: TXNS, clients: CLIENTS, rows }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
