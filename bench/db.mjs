// Database wire listener benchmark (issue 30): in one run, pgbench (`-S`, TPC-B and `-S -M prepared`, scale 10,
// -c 8 -j 2 -T 20) against PostgreSQL directly, through a private PgBouncer (transaction mode, default_pool_size 8;
// a second one in session mode for `-M prepared`, which PgBouncer 1.18's transaction mode cannot run), optionally
// through a bare Node.js relay (bench/lib/pg-relay.mjs: the floor of any Node.js proxy) and through poolgate's
// PostgreSQL listener (max_concurrent 8, transaction mode); sysbench oltp_read_only against MariaDB directly and
// through poolgate's MySQL listener. Targets alternate within each round; the tables quote each target's median
// round, the proxy's CPU per transaction (from /proc/<pid>/stat) beside it.
// Usage: npm run bench:db [-- --quick] [-- --write-results]   (--quick: 5 s runs; env BENCH_DURATION seconds per
// run, default 20; BENCH_ROUNDS, default 2; BENCH_CLIENTS, default 8; BENCH_POOL_SIZE (PgBouncer pool size = poolgate
// max_concurrent), default 8; BENCH_SCALE pgbench scale, default 10; BENCH_RATE=<tps> runs pgbench at that fixed
// rate (CPU per transaction compared at equal load); BENCH_TARGETS=direct,pgbouncer,node-relay,poolgate (default
// without node-relay); BENCH_SUITES=pg,mysql; BENCH_WORKLOADS='-S;TPC-B' (names as in the table, ';'-separated)
// picks the pgbench workloads (also 'select-only, extended' and 'simple-update (read-write)');
// BENCH_CPU_PROF=<dir> runs poolgate with --cpu-prof into dir; BENCH_NODE_ARGS adds node flags to poolgate's (e.g. --perf-basic-prof for `perf record -p`); BENCH_STRACE=<dir> runs it under `strace -f -c` (its syscalls, counted, in dir); BENCH_RENDER=bench/out/db-….json rewrites the section
// from a saved run; BENCH_BASELINE=<another built checkout> adds its poolgate as the target `baseline`, alternated
// with this one: before/after a change in one run); BENCH_CALLGRIND=<transactions> (with BENCH_SUITES=mysql) runs the
// poolgate targets under valgrind's callgrind instead of timing them: per round, after a warm-up of half as many
// transactions, the proxy's instructions over exactly that many sysbench transactions, per transaction (repeatable on
// a shared machine where CPU time and TPS are not; the TPS of a target under callgrind means nothing).
// Writes bench/out/db-*.json; with --write-results also the text between `<!-- bench:db:start -->` and
// `<!-- bench:db:end -->` in bench/RESULTS.md.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import mysql from 'mysql2/promise';
import { apiCaller, root, startPoolgate } from './lib/poolgate.mjs';
import { machine, writeJson, writeMarkedSection, RESULTS_PATH, WRITE_RESULTS } from './lib/results.mjs';
import { ensureTool } from './lib/wrk.mjs';
import { startPgbouncer } from './lib/pgbouncer.mjs';
import { pgbench } from './lib/pgbench.mjs';
import { sysbench } from './lib/sysbench.mjs';
import { cpuMeter } from './lib/cpu.mjs';
import { startChild } from './lib/child.mjs';

function intEnv(name, def, min) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return def;
  if (!/^\d+$/.test(raw) || Number(raw) < min) throw new Error(`${name} must be an integer ≥ ${min}, got ${JSON.stringify(raw)}`);
  return Number(raw);
}
const listEnv = (name, def) => (process.env[name] || def).split(',').map((s) => s.trim()).filter(Boolean);

const QUICK = process.argv.includes('--quick');
const settings = {
  duration_s: intEnv('BENCH_DURATION', QUICK ? 5 : 20, 1),
  rounds: intEnv('BENCH_ROUNDS', 2, 1),
  clients: intEnv('BENCH_CLIENTS', 8, 1),
  pgbench_threads: 2,
  pool_size: intEnv('BENCH_POOL_SIZE', 8, 1),
  /** pgbench -R: a fixed rate (tps) instead of as fast as possible; 0 = unthrottled. */
  rate: intEnv('BENCH_RATE', 0, 0),
  pgbench_scale: intEnv('BENCH_SCALE', 10, 1),
  sysbench_tables: 4,
  sysbench_table_size: 10_000,
  targets: listEnv('BENCH_TARGETS', 'direct,pgbouncer,poolgate'),
  suites: listEnv('BENCH_SUITES', 'pg,mysql'),
  poolgate_store: 'embedded (PGlite, fresh data dir)',
  poolgate_adaptive: false,
  /** BENCH_CALLGRIND: sysbench transactions counted per round under callgrind (0: timed runs). */
  callgrind_txns: intEnv('BENCH_CALLGRIND', 0, 0),
};
const PG = { host: '127.0.0.1', port: 5432, admin: 'postgres' };
const MY = { host: '127.0.0.1', port: 3306, admin: 'root' };
const suffix = randomBytes(3).toString('hex');
const ROLE = `bench_db_${suffix}`;
const PASSWORD = `bench-${randomBytes(6).toString('hex')}`;
const log = (msg) => process.stderr.write(`bench:db: ${msg}\n`);

/**
 * pgbench workloads: issue 30's three by default (`-S`, TPC-B, `-S -M prepared`), the others when named in
 * BENCH_WORKLOADS. `session`: PgBouncer 1.18 (Debian 12) keeps no prepared statements in transaction mode
 * (pgbench aborts), so its session-mode instance stands in for it there.
 */
const PG_WORKLOADS = [
  { name: '-S', args: ['-S', '-M', 'simple'] },
  { name: 'TPC-B', args: ['-M', 'simple'] },
  { name: '-S -M prepared', args: ['-S', '-M', 'prepared'], session: true },
  { name: 'select-only, extended', args: ['-S', '-M', 'extended'], optional: true },
  { name: 'simple-update (read-write)', args: ['-N', '-M', 'simple'], optional: true },
];
const pgWorkloads = () =>
  PG_WORKLOADS.filter((x) => (process.env.BENCH_WORKLOADS ? process.env.BENCH_WORKLOADS.split(';').includes(x.name) : !x.optional));

/** apt-get update once, then install what is missing (PgBouncer, sysbench). */
function ensureTools() {
  const need = [['pgbouncer', 'pgbouncer'], ['sysbench', 'sysbench']];
  const missing = need.filter(([bin]) => !ensureTool(bin, bin, () => {}) );
  if (missing.length) {
    log(`apt-get update (missing: ${missing.map(([b]) => b).join(', ')})`);
    try {
      execFileSync('apt-get', ['update'], { stdio: 'ignore', timeout: 300_000 });
    } catch (err) {
      log(`apt-get update failed: ${String(err.message).split('\n')[0]}`);
    }
  }
  return Object.fromEntries(need.map(([bin, pkg]) => [bin, ensureTool(bin, pkg, log)]));
}

async function preparePostgres() {
  const admin = new pg.Client({ host: PG.host, port: PG.port, user: PG.admin, database: 'postgres' });
  await admin.connect();
  await admin.query(`CREATE ROLE ${ROLE} LOGIN PASSWORD '${PASSWORD}'`);
  await admin.query(`CREATE DATABASE ${ROLE} OWNER ${ROLE}`);
  await admin.end();
  log(`pgbench -i -s ${settings.pgbench_scale} into ${ROLE}`);
  execFileSync('pgbench', ['-h', PG.host, '-p', String(PG.port), '-U', ROLE, '-i', '-q', '-s', String(settings.pgbench_scale), ROLE], {
    env: { ...process.env, PGPASSWORD: PASSWORD }, stdio: 'ignore', timeout: 600_000,
  });
  return async () => {
    const c = new pg.Client({ host: PG.host, port: PG.port, user: PG.admin, database: 'postgres' });
    await c.connect();
    await c.query(`DROP DATABASE IF EXISTS ${ROLE} WITH (FORCE)`);
    await c.query(`DROP ROLE IF EXISTS ${ROLE}`);
    await c.end();
  };
}

async function prepareMysql() {
  const root = await mysql.createConnection({ host: MY.host, port: MY.port, user: MY.admin });
  await root.query(`CREATE DATABASE ${ROLE}`);
  for (const h of ['localhost', '127.0.0.1', '%']) {
    await root.query(`CREATE USER '${ROLE}'@'${h}' IDENTIFIED BY '${PASSWORD}'`);
    await root.query(`GRANT ALL ON ${ROLE}.* TO '${ROLE}'@'${h}'`);
  }
  await root.end();
  log(`sysbench oltp_read_only prepare into ${ROLE}`);
  const prep = await sysbench({ ...sysbenchBase(), host: MY.host, port: MY.port, user: ROLE, password: PASSWORD, command: 'prepare' });
  if (!prep.ok) throw new Error(`sysbench prepare: ${prep.error}`);
  return async () => {
    const c = await mysql.createConnection({ host: MY.host, port: MY.port, user: MY.admin });
    await c.query(`DROP DATABASE IF EXISTS ${ROLE}`);
    for (const h of ['localhost', '127.0.0.1', '%']) await c.query(`DROP USER IF EXISTS '${ROLE}'@'${h}'`);
    await c.end();
  };
}
const callgrindDir = (dir) => {
  const d = join(dir, 'cg');
  mkdirSync(d, { recursive: true });
  return d;
};

/** The instructions callgrind counted in `pid` (every thread) since its counters were last zeroed. */
function callgrindIr(cgDir, pid) {
  const before = new Set(readdirSync(cgDir));
  execFileSync('callgrind_control', ['-d', String(pid)], { stdio: 'ignore' });
  let ir = 0;
  for (const f of readdirSync(cgDir).filter((x) => x.startsWith(`cg.${pid}`) && !before.has(x))) {
    const m = /^summary:\s+(\d+)/m.exec(readFileSync(join(cgDir, f), 'utf8'));
    if (m) ir += Number(m[1]);
  }
  if (ir === 0) throw new Error(`no callgrind dump for ${pid} in ${cgDir}`);
  return ir;
}

/**
 * BENCH_CALLGRIND: sysbench against a poolgate under callgrind: the first time a warm-up (its JIT and caches),
 * then exactly `n` transactions with the counters zeroed before; Ir per transaction.
 */
async function callgrindRun(cgDir, tg, n) {
  if (!tg.warm) {
    // The warm-up runs uninstrumented (valgrind's plain translation, several times faster): instrumented and
    // cold, its 8 logins and their statement prepares overran sysbench's fixed 30 s worker start-up limit on
    // the loaded 2-core machine. Its JIT, caches and idle server connections carry over to the counted run.
    // Tried three times: a cold process under valgrind on a machine at load average 15+ missed even that limit
    // uninstrumented, and each try warms it further.
    let w;
    for (let i = 0; i < 3 && !w?.ok; i++) w = await sysbench({ ...sysbenchBase(), ...tg, threads: settings.clients, events: Math.max(1, Math.round(n / 2)) });
    if (!w.ok) return w;
    execFileSync('callgrind_control', ['-i', 'on', String(tg.pid)], { stdio: 'ignore' });
    tg.warm = true;
  }
  execFileSync('callgrind_control', ['-z', String(tg.pid)], { stdio: 'ignore' });
  const r = await sysbench({ ...sysbenchBase(), ...tg, threads: settings.clients, events: n });
  if (r.ok) r.ir_per_txn = Math.round(callgrindIr(cgDir, tg.pid) / r.transactions);
  return r;
}

const sysbenchBase = () => ({ database: ROLE, tables: settings.sysbench_tables, tableSize: settings.sysbench_table_size });

/**
 * poolgate as a child process on its embedded store: a postgres and a mysql database pool made through the
 * Control API, each given the bench role as its managed credential, a key, max_concurrent = the PgBouncer pool
 * size and adaptive concurrency off (so the limit stays put and nothing queues unexpectedly).
 */
async function startPoolgateTarget(dir, bin) {
  const nodeArgs = process.env.BENCH_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF}`] : [];
  if (process.env.BENCH_NODE_ARGS) nodeArgs.push(...process.env.BENCH_NODE_ARGS.split(' ').filter(Boolean));
  // Counting off until the sysbench warm-up is over (start-up under instrumentation would take minutes).
  const wrap = settings.callgrind_txns ? ['valgrind', '--tool=callgrind', '--instr-atstart=no', `--callgrind-out-file=${callgrindDir(dir)}/cg.%p`] : process.env.BENCH_STRACE ? ['strace', '-f', '-c', '-o', `${process.env.BENCH_STRACE}/strace.${Date.now()}`] : undefined;
  const svc = await startPoolgate({
    POOLGATE_ALLOW_PRIVATE_TARGETS: 'true',
    POOLGATE_DB_ALLOW_INSECURE: 'true',
    POOLGATE_LOG_LEVEL: 'warn',
    POOLGATE_ACCESS_LOG_FILE: join(dir, bin ? 'baseline-access.log' : 'poolgate-access.log'),
  }, { nodeArgs, bin, wrap });
  try {
    const boot = await svc.admin(['bootstrap', '--team', 'Bench', '--email', 'bench@bench.test', '--plan', 'business']);
    const call = apiCaller(svc.controlUrl, boot.token);
    const pools = {};
    for (const [backend, port] of [['postgres', PG.port], ['mysql', MY.port]]) {
      const pool = await call('POST', '/api/v1/pools/database', { db_host: 'localhost', db_port: port, db_name: ROLE, name: `bench-${backend}` }, 201);
      await call('PUT', `/api/v1/pools/${pool.subdomain}/credential`, { method: 'postgres_role', username: ROLE, password: PASSWORD }, 200);
      await call('PATCH', `/api/v1/pools/${pool.subdomain}/settings`, { max_concurrent: settings.pool_size, settings: { adaptive: false } }, 200);
      const minted = await call('POST', `/api/v1/pools/${pool.subdomain}/keys`, { label: 'bench' }, 201);
      pools[backend] = { sub: pool.subdomain, key: minted.key };
    }
    return { svc, pools, ports: { pg: svc.listening.pg, mysql: svc.listening.mysql } };
  } catch (err) {
    await svc.stop();
    throw err;
  }
}

/** Waits until a query works through the target (the data plane loads its snapshot asynchronously). */
async function ready(name, probe) {
  let last;
  for (let i = 0; i < 100; i++) {
    try {
      await probe();
      return;
    } catch (err) {
      last = err;
      await new Promise((r) => setTimeout(r, 200));
    }
  }
  throw new Error(`${name}: no query got through: ${last?.message}`);
}

/** A run's proxy CPU fields: the total, and its user and system parts (µs per transaction). */
const cpuFields = (c) => ({ proxy_cpu_us_per_txn: c?.total ?? null, proxy_cpu_user_us: c?.user ?? null, proxy_cpu_system_us: c?.system ?? null });
const cpuText = (r) => (r.proxy_cpu_us_per_txn === null ? '—' : `${r.proxy_cpu_us_per_txn} (user ${r.proxy_cpu_user_us}, sys ${r.proxy_cpu_system_us})`);

const median = (xs) => {
  const s = xs.filter((x) => x !== null && x !== undefined && Number.isFinite(x)).sort((a, b) => a - b);
  if (!s.length) return null;
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const ratio = (a, b) => (a && b ? Math.round((a / b) * 100) / 100 : null);
const fmt = (n, d = 0) => (n === null || n === undefined || !Number.isFinite(n) ? '—' : n.toFixed(d));

/** The round whose TPS is the median of a target's rounds (so its latencies belong to the same run). */
function medianRun(runs) {
  const ok = runs.filter((r) => r.ok);
  if (!ok.length) return runs.at(-1) ?? null;
  const sorted = [...ok].sort((a, b) => a.tps - b.tps);
  return { ...sorted[Math.floor((sorted.length - 1) / 2)], tps_median: median(ok.map((r) => r.tps)), tps_rounds: runs.map((r) => r.tps), ok_rounds: ok.length };
}

async function main() {
  if (process.env.BENCH_RENDER) {
    // Re-renders the section from a saved run (bench/out/db-*.json), e.g. after changing this layout.
    const o = JSON.parse(readFileSync(process.env.BENCH_RENDER, 'utf8'));
    o.ratios = ratiosOf(o.results);
    writeMarkedSection('db', section(o), 'Database wire listeners');
    return;
  }
  const started = new Date();
  const builtFrom = build();
  const m = machine();
  const load = { start: loadavg().map((x) => Math.round(x * 100) / 100) };
  const tools = ensureTools();
  log(`tools: ${JSON.stringify(tools)}; load ${load.start.join(' ')}`);
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-db-'));
  const cleanups = [];
  const results = { pg: {}, mysql: {} };
  const notes = [];
  try {
    const wantPg = settings.suites.includes('pg');
    const wantMy = settings.suites.includes('mysql') && tools.sysbench;
    if (wantPg) cleanups.push(await preparePostgres());
    if (wantMy) cleanups.push(await prepareMysql());

    const pgTargets = {};
    if (wantPg && settings.targets.includes('direct')) pgTargets.direct = { host: PG.host, port: PG.port, user: ROLE, password: PASSWORD, database: ROLE };
    if (wantPg && settings.targets.includes('pgbouncer') && tools.pgbouncer) {
      const bouncer = await startPgbouncer({
        upstream: { host: PG.host, port: PG.port, database: ROLE, user: ROLE }, alias: ROLE, user: ROLE, password: PASSWORD, poolSize: settings.pool_size,
      });
      cleanups.push(() => bouncer.stop());
      settings.pgbouncer = { version: bouncer.version, ...bouncer.settings };
      pgTargets.pgbouncer = { host: '127.0.0.1', port: bouncer.port, user: ROLE, password: PASSWORD, database: ROLE, pid: bouncer.pid };
      if (pgWorkloads().some((w) => w.session)) {
        const session = await startPgbouncer({
          upstream: { host: PG.host, port: PG.port, database: ROLE, user: ROLE }, alias: ROLE, user: ROLE, password: PASSWORD, poolSize: settings.pool_size, poolMode: 'session',
        });
        cleanups.push(() => session.stop());
        pgTargets['pgbouncer-session'] = { host: '127.0.0.1', port: session.port, user: ROLE, password: PASSWORD, database: ROLE, pid: session.pid };
      }
    }
    if (wantPg && settings.targets.includes('node-relay')) {
      const relay = await startChild(join(root, 'bench/lib/pg-relay.mjs'), [PG.host, String(PG.port)]);
      cleanups.push(() => relay.stop());
      pgTargets['node-relay'] = { host: '127.0.0.1', port: relay.port, user: ROLE, password: PASSWORD, database: ROLE, pid: relay.pid };
    }
    const myTargets = {};
    if (wantMy && settings.targets.includes('direct')) myTargets.direct = { host: MY.host, port: MY.port, user: ROLE, password: PASSWORD };
    if (settings.targets.includes('poolgate')) {
      const pgt = await startPoolgateTarget(dir);
      cleanups.push(() => pgt.svc.stop());
      if (wantPg && pgt.ports.pg) {
        pgTargets.poolgate = { host: '127.0.0.1', port: pgt.ports.pg, user: ROLE, password: pgt.pools.postgres.key, database: ROLE, options: `pool=${pgt.pools.postgres.sub}`, pid: pgt.svc.pid };
      } else if (wantPg) notes.push('poolgate printed no `pg` port: its PostgreSQL listener is not in this build.');
      if (wantMy && pgt.ports.mysql) {
        myTargets.poolgate = { host: '127.0.0.1', port: pgt.ports.mysql, user: pgt.pools.mysql.sub, password: pgt.pools.mysql.key, pid: pgt.svc.pid };
      } else if (wantMy) notes.push('poolgate printed no `mysql` port: its MySQL listener is not in this build.');
    }
    if (process.env.BENCH_BASELINE) {
      const base = await startPoolgateTarget(dir, join(process.env.BENCH_BASELINE, 'bin', 'poolgate.js'));
      cleanups.push(() => base.svc.stop());
      settings.baseline = `${process.env.BENCH_BASELINE} at ${build(process.env.BENCH_BASELINE)}`;
      if (wantPg && base.ports.pg) pgTargets.baseline = { host: '127.0.0.1', port: base.ports.pg, user: ROLE, password: base.pools.postgres.key, database: ROLE, options: `pool=${base.pools.postgres.sub}`, pid: base.svc.pid };
      if (wantMy && base.ports.mysql) myTargets.baseline = { host: '127.0.0.1', port: base.ports.mysql, user: base.pools.mysql.sub, password: base.pools.mysql.key, pid: base.svc.pid };
    }
    for (const [name, tg] of Object.entries(pgTargets)) {
      await ready(`pg ${name}`, async () => {
        const c = new pg.Client({ host: tg.host, port: tg.port, user: tg.user, password: tg.password, database: tg.database, options: tg.options });
        await c.connect();
        try {
          await c.query('SELECT count(*) FROM pgbench_branches');
        } finally {
          await c.end();
        }
      });
    }
    for (const [name, tg] of Object.entries(myTargets)) {
      await ready(`mysql ${name}`, async () => {
        const c = await mysql.createConnection({ host: tg.host, port: tg.port, user: tg.user, password: tg.password, database: ROLE });
        try {
          await c.query('SELECT COUNT(*) FROM sbtest1');
        } finally {
          await c.end();
        }
      });
    }

    const runs = { pg: {}, mysql: {} };
    for (let round = 1; round <= settings.rounds; round++) {
      for (const w of pgWorkloads()) {
        for (const [target, tg] of Object.entries(pgTargets)) {
          // PgBouncer: the session-mode instance for the workload that needs it, the transaction-mode one otherwise; either is `pgbouncer` in the tables.
          if (target === (w.session ? 'pgbouncer' : 'pgbouncer-session')) continue;
          const name = target === 'pgbouncer-session' ? 'pgbouncer' : target;
          const cpu = cpuMeter(tg.pid);
          const r = await pgbench({ ...tg, args: settings.rate ? [...w.args, '-R', String(settings.rate)] : w.args, clients: settings.clients, threads: settings.pgbench_threads, duration: settings.duration_s });
          Object.assign(r, cpuFields(cpu.per(r.transactions)));
          log(`round ${round} pgbench ${w.name} ${name}: ${r.ok ? `${r.tps} tps, p95 ${r.latency_ms?.p95} ms, proxy CPU ${cpuText(r)} µs/txn` : r.error}`);
          ((runs.pg[w.name] ??= {})[name] ??= []).push({ round, ...r });
        }
      }
      for (const [name, tg] of Object.entries(myTargets)) {
        if (settings.callgrind_txns && tg.pid) {
          const r = await callgrindRun(callgrindDir(dir), tg, settings.callgrind_txns);
          Object.assign(r, cpuFields(null));
          log(`round ${round} sysbench oltp_read_only ${name} under callgrind: ${r.ok ? `${r.ir_per_txn} instructions per transaction (${r.transactions} transactions)` : r.error}`);
          ((runs.mysql['oltp_read_only'] ??= {})[name] ??= []).push({ round, ...r });
          continue;
        }
        const cpu = cpuMeter(tg.pid);
        const r = await sysbench({ ...sysbenchBase(), ...tg, threads: settings.clients, duration: settings.duration_s });
        Object.assign(r, cpuFields(cpu.per(r.transactions)));
        log(`round ${round} sysbench oltp_read_only ${name}: ${r.ok ? `${r.tps} tps, p95 ${r.latency_ms?.p95} ms, proxy CPU ${cpuText(r)} µs/txn` : r.error}`);
        ((runs.mysql['oltp_read_only'] ??= {})[name] ??= []).push({ round, ...r });
      }
    }
    for (const suite of ['pg', 'mysql']) {
      for (const [w, byTarget] of Object.entries(runs[suite])) {
        results[suite][w] = Object.fromEntries(Object.entries(byTarget).map(([name, rs]) => [name, { median: medianRun(rs), rounds: rs }]));
      }
    }
  } finally {
    for (const c of cleanups.reverse()) {
      try {
        await c();
      } catch (err) {
        log(`cleanup: ${err.message}`);
      }
    }
    rmSync(dir, { recursive: true, force: true });
  }
  load.end = loadavg().map((x) => Math.round(x * 100) / 100);

  const out = { started: started.toISOString(), machine: m, load, settings, build: builtFrom, results, ratios: ratiosOf(results), notes };
  const jsonPath = writeJson(`db-${started.toISOString().replace(/[:.]/g, '-')}.json`, out);
  log(`raw results: ${jsonPath}`);
  if (WRITE_RESULTS) {
    writeMarkedSection('db', section(out), 'Database wire listeners');
    log(`wrote ${RESULTS_PATH}`);
  } else log('RESULTS.md untouched: pass --write-results to rewrite its bench:db section');
  for (const r of out.ratios) log(`${r.suite} ${r.workload}: poolgate/pgbouncer ${r.poolgate_over_pgbouncer ?? '—'}, poolgate/direct ${r.poolgate_over_direct ?? '—'}`);
}

/** Ratios of median TPS, and the median of the per-round ratios (runs next to each other in time, less exposed to drifting load). */
function ratiosOf(results) {
  const ratios = [];
  for (const [suite, byWorkload] of Object.entries(results)) {
    for (const [w, t] of Object.entries(byWorkload)) {
      const tps = (k) => t[k]?.median?.tps_median ?? null;
      const perRound = (a, b) => median((t[a]?.rounds ?? []).map((r, i) => ratio(r.tps, t[b]?.rounds[i]?.tps)));
      ratios.push({
        suite, workload: w,
        poolgate_over_pgbouncer: ratio(tps('poolgate'), tps('pgbouncer')), poolgate_over_pgbouncer_per_round: perRound('poolgate', 'pgbouncer'),
        poolgate_over_direct: ratio(tps('poolgate'), tps('direct')), poolgate_over_direct_per_round: perRound('poolgate', 'direct'),
        pgbouncer_over_direct: ratio(tps('pgbouncer'), tps('direct')),
        poolgate_over_relay: ratio(tps('poolgate'), tps('node-relay')), poolgate_over_relay_per_round: perRound('poolgate', 'node-relay'),
        relay_over_pgbouncer: ratio(tps('node-relay'), tps('pgbouncer')), relay_over_pgbouncer_per_round: perRound('node-relay', 'pgbouncer'),
        poolgate_over_baseline: ratio(tps('poolgate'), tps('baseline')), poolgate_over_baseline_per_round: perRound('poolgate', 'baseline'),
        baseline_over_pgbouncer: ratio(tps('baseline'), tps('pgbouncer')),
      });
    }
  }
  return ratios;
}

/** The commit measured (and whether the tree had changes on top). */
function build(dir = root) {
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: dir }).toString().trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no', 'src'], { cwd: dir }).toString().trim() !== '';
    return `${head}${dirty ? ' + uncommitted src changes' : ''}`;
  } catch {
    return 'unknown';
  }
}

function section(o) {
  const lines = [];
  lines.push(`Measured ${o.started.slice(0, 16).replace('T', ' ')} UTC by \`npm run bench:db\` (poolgate at ${o.build ?? 'unknown'}) on ${o.machine.nproc} × ${o.machine.cpu}, ${o.machine.memory_gib} GiB, Node ${o.machine.node}.`);
  lines.push(`Load average (1/5/15 min) at start ${o.load.start.join(' / ')}, at end ${o.load.end.join(' / ')}. The machine is shared with other`);
  lines.push('work and has 2 cores for the database server, the proxy under test and the load generator together: figures are');
  lines.push('noisy and a lower bound; compare the targets side by side (they alternate within each round), not with other runs.');
  lines.push('');
  lines.push(`Settings: ${o.settings.clients} clients, ${o.settings.duration_s} s per run, ${o.settings.rounds} rounds (each cell is the round with the`);
  lines.push(`median TPS; every round's TPS in the JSON). pgbench scale ${o.settings.pgbench_scale}, \`-j ${o.settings.pgbench_threads} -n\`; PgBouncer`);
  lines.push(`${o.settings.pgbouncer ? `(${o.settings.pgbouncer.version}) pool_mode=transaction (session for \`-M prepared\`: its transaction mode aborts), default_pool_size=${o.settings.pgbouncer.default_pool_size}` : '(not run)'}; poolgate max_concurrent=${o.settings.pool_size} (transaction mode),`);
  lines.push(`adaptive off, one process with every role on its embedded store, access log to a file. sysbench oltp_read_only with`);
  lines.push(`${o.settings.sysbench_tables} tables × ${o.settings.sysbench_table_size} rows, prepared statements (\`--db-ps-mode=auto\`).`);
  const relayRan = Object.values(o.results.pg ?? {}).some((t) => t['node-relay']);
  if (relayRan) {
    lines.push('node-relay: bench/lib/pg-relay.mjs, each client piped to its own server connection (read → write, no parsing,');
    lines.push('pooling or admission; both sides read through `onread` and written through the handle\'s `writeBuffer`, as poolgate\'s');
    lines.push('listeners do): what any Node.js proxy pays for its sockets, so poolgate / node-relay is the cost of poolgate itself,');
    lines.push('and node-relay / PgBouncer the most a Node.js proxy on this socket path can reach.');
  }
  lines.push('Proxy CPU: the proxy process\'s user + system time (from /proc/<pid>/stat) over the run, per transaction.');
  if (o.settings.rate) lines.push(`pgbench ran at a fixed rate of ${o.settings.rate} tps (\`-R\`): compare CPU per transaction, not TPS.`);
  lines.push('');
  lines.push('| suite | workload | target | TPS (median) | TPS per round | latency avg ms | p95 ms | failed | proxy CPU µs/txn (median) | of it user / system |');
  lines.push('| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |');
  for (const [suite, byWorkload] of Object.entries(o.results)) {
    for (const [w, t] of Object.entries(byWorkload)) {
      for (const [name, r] of Object.entries(t)) {
        const md = r.median;
        const failed = suite === 'pg' ? r.rounds.reduce((a, x) => a + (x.failed || 0), 0) : r.rounds.reduce((a, x) => a + (x.errors || 0), 0);
        const tool = suite === 'pg' ? 'pgbench' : 'sysbench';
        lines.push(`| ${tool} | ${w} | ${name} | ${md?.ok ? fmt(md.tps_median) : `error: ${String(md?.error ?? '').slice(0, 80).replace(/\|/g, '/')}`} | ${r.rounds.map((x) => fmt(x.tps)).join(', ')} | ${fmt(md?.latency_ms?.avg, 2)} | ${fmt(md?.latency_ms?.p95, 2)} | ${failed} | ${fmt(median(r.rounds.map((x) => x.proxy_cpu_us_per_txn)), 1)} | ${fmt(median(r.rounds.map((x) => x.proxy_cpu_user_us)), 1)} / ${fmt(median(r.rounds.map((x) => x.proxy_cpu_system_us)), 1)} |`);
      }
    }
  }
  lines.push('');
  lines.push('Ratios of the median TPS; in brackets the median of the per-round ratios (targets measured back to back).');
  lines.push('');
  const both = (a, b) => (a === null || a === undefined ? '—' : `${fmt(a, 2)} (${fmt(b, 2)})`);
  const relayCols = relayRan ? ' bare Node.js relay / PgBouncer TPS | poolgate / bare Node.js relay TPS |' : '';
  lines.push(`| suite | workload | poolgate / PgBouncer TPS (target ≥ 1.0) | poolgate / direct TPS | PgBouncer / direct TPS |${relayCols}`);
  lines.push(`| --- | --- | ---: | ---: | ---: |${relayRan ? ' ---: | ---: |' : ''}`);
  for (const r of o.ratios) {
    const relay = relayRan ? ` ${both(r.relay_over_pgbouncer, r.relay_over_pgbouncer_per_round)} | ${both(r.poolgate_over_relay, r.poolgate_over_relay_per_round)} |` : '';
    lines.push(`| ${r.suite} | ${r.workload} | ${both(r.poolgate_over_pgbouncer, r.poolgate_over_pgbouncer_per_round)} | ${both(r.poolgate_over_direct, r.poolgate_over_direct_per_round)} | ${fmt(r.pgbouncer_over_direct, 2)} |${relay}`);
  }
  if (o.settings.baseline) {
    lines.push('');
    lines.push(`Before/after: \`baseline\` is ${o.settings.baseline}, alternated with \`poolgate\` in every round.`);
    lines.push('');
    lines.push('| suite | workload | poolgate / baseline TPS | baseline / PgBouncer TPS | poolgate / PgBouncer TPS |');
    lines.push('| --- | --- | ---: | ---: | ---: |');
    for (const r of o.ratios) lines.push(`| ${r.suite} | ${r.workload} | ${both(r.poolgate_over_baseline, r.poolgate_over_baseline_per_round)} | ${fmt(r.baseline_over_pgbouncer, 2)} | ${fmt(r.poolgate_over_pgbouncer, 2)} |`);
  }
  const counted = Object.entries(o.results.mysql?.oltp_read_only ?? {}).filter(([, r]) => r.rounds.some((x) => x.ir_per_txn));
  if (counted.length) {
    const irOf = (name) => median((o.results.mysql.oltp_read_only[name]?.rounds ?? []).map((x) => x.ir_per_txn));
    lines.push('');
    lines.push(`Instructions per sysbench oltp_read_only transaction under callgrind (\`BENCH_CALLGRIND=${o.settings.callgrind_txns}\`: after a warm-up,`);
    lines.push(`exactly ${o.settings.callgrind_txns} transactions per round, ${o.settings.clients} threads; every thread of the proxy process; repeatable where CPU time is not;`);
    lines.push('TPS and CPU time of a target under callgrind mean nothing):');
    lines.push('');
    lines.push('| target | instructions per transaction (median) | per round | / baseline |');
    lines.push('| --- | ---: | --- | ---: |');
    for (const [name, r] of counted) {
      const vs = name !== 'baseline' && irOf('baseline') ? fmt(irOf(name) / irOf('baseline'), 3) : '—';
      lines.push(`| ${name} | ${Math.round(irOf(name)).toLocaleString('en')} | ${r.rounds.map((x) => (x.ir_per_txn ?? 0).toLocaleString('en')).join(', ')} | ${vs} |`);
    }
  }
  if (o.notes.length) {
    lines.push('');
    for (const n of o.notes) lines.push(`- ${n}`);
  }
  return lines.join('\n');
}

main().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
