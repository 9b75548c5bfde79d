// Control API benchmark: the real `poolgate start` (embedded PGlite store) under autocannon, reads and a write.
// Usage: npm run bench:control   (env BENCH_DURATION seconds, default 10; BENCH_CONNECTIONS, default 50;
// BENCH_WARMUP seconds, default 2; BENCH_POOLS, default 20; -- --write-results). Writes bench/out/control-*.json and,
// with --write-results, the bench:control section of bench/RESULTS.md.
import { api, startPoolgate } from './lib/poolgate.mjs';
import { measure } from './lib/load.mjs';
import { benchCommand, machine, writeJson, writeResults } from './lib/results.mjs';

function intEnv(name, def, min) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return def;
  if (!/^\d+$/.test(raw) || Number(raw) < min) throw new Error(`${name} must be an integer ≥ ${min}, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

const settings = {
  duration_s: intEnv('BENCH_DURATION', 10, 1),
  connections: intEnv('BENCH_CONNECTIONS', 50, 1),
  warmup_s: intEnv('BENCH_WARMUP', 2, 0),
  pools: intEnv('BENCH_POOLS', 20, 1),
  store: 'pglite (embedded, fresh data dir)',
  log_level: 'warn',
};

const log = (msg) => process.stderr.write(`bench:control: ${msg}\n`);

async function main() {
  const m = machine();
  const svc = await startPoolgate({ POOLGATE_ALLOW_PRIVATE_TARGETS: 'true', POOLGATE_LOG_LEVEL: settings.log_level });
  log(`poolgate pid ${svc.pid} listening on control port ${svc.listening.control}`);
  const rows = [];
  const notes = [];
  try {
    const boot = await svc.admin(['bootstrap', '--team', 'Bench', '--email', 'bench@bench.test', '--plan', 'business']);
    const token = boot.token;
    const auth = { authorization: `Bearer ${token}` };
    const base = svc.controlUrl;

    // Pools through the public endpoint, as a client would create them. Origins are loopback (allowed here), but
    // not 127.0.0.1, which is the service's own host and refused as a target.
    const subdomains = [];
    for (let i = 0; i < settings.pools; i++) {
      const res = await api(base, token, 'POST', '/api/v1/pools', { origin: `https://127.0.0.2:${20000 + i}`, name: `bench-${i}` });
      if (res.status === 404 && i === 0) {
        notes.push('POST /api/v1/pools is not served: the pool list is empty and the mint row is skipped.');
        break;
      }
      if (res.status !== 201) throw new Error(`POST /api/v1/pools → ${res.status} ${JSON.stringify(res.body)}`);
      subdomains.push(res.body.data.subdomain);
    }

    // A few budgets with pools attached, so the budgets list has content (operator CLI, as the spec's dashboard).
    let budgets = 0;
    try {
      for (let b = 0; b < 3; b++) {
        const made = await svc.admin(['budget', 'create', '--team', boot.team.slug, '--name', `bench-budget-${b}`, '--origin-max', '20']);
        const id = made.id ?? made.data?.id ?? made.budget?.id;
        budgets++;
        for (const sub of subdomains.slice(b * 3, b * 3 + 3)) {
          await svc.admin(['budget', 'attach', '--team', boot.team.slug, '--budget', String(id), '--pool', sub, '--reserved', '2']);
        }
      }
    } catch (err) {
      notes.push(`budgets: only ${budgets} created (${String(err.message).split('\n')[0]}).`);
    }

    const targets = [
      { name: 'GET /api/v1/me', path: '/api/v1/me' },
      { name: `GET /api/v1/pools (${subdomains.length} pools)`, path: '/api/v1/pools', expect: (b) => b?.data?.length === subdomains.length },
      { name: `GET /api/v1/budgets (${budgets} budgets)`, path: '/api/v1/budgets', expect: (b) => b?.data?.length === budgets },
    ];
    if (subdomains.length > 0) {
      targets.push({
        name: `POST /api/v1/pools/{pool}/keys (mint, over ${subdomains.length} pools)`,
        method: 'POST',
        paths: subdomains.map((s) => `/api/v1/pools/${s}/keys`),
        body: JSON.stringify({ label: 'bench' }),
      });
    }

    for (const t of targets) {
      const method = t.method ?? 'GET';
      const path = t.path ?? t.paths[0];
      // One checked request first: a benchmark of a 404 or a wrong answer measures nothing.
      const probe = await api(base, token, method, path, t.body === undefined ? undefined : JSON.parse(t.body));
      if (probe.status < 200 || probe.status > 299 || (t.expect && !t.expect(probe.body))) {
        notes.push(`${t.name}: skipped, probe answered ${probe.status} ${JSON.stringify(probe.body).slice(0, 200)}`);
        continue;
      }
      const spec = {
        name: t.name,
        url: base + path,
        method,
        headers: { ...auth, ...(t.body ? { 'content-type': 'application/json' } : {}) },
        body: t.body,
        paths: t.paths,
        connections: settings.connections,
      };
      if (settings.warmup_s > 0) await measure({ ...spec, duration: settings.warmup_s });
      log(`${t.name}: ${settings.duration_s} s × ${settings.connections} connections`);
      const row = await measure({ ...spec, duration: settings.duration_s });
      rows.push(row);
      log(`  ${row.rps} req/s, p50 ${row.latency_ms.p50} ms, p99 ${row.latency_ms.p99} ms, errors ${row.errors}, non-2xx ${row.non2xx}`);
    }

    // The service must still answer correctly after the load.
    const after = await api(base, token, 'GET', '/api/v1/me');
    if (after.status !== 200) throw new Error(`GET /api/v1/me after the load → ${after.status}`);
  } finally {
    const exit = await svc.stop();
    if (exit.code !== 0) notes.push(`poolgate exited with ${exit.code ?? exit.signal} on SIGTERM`);
  }

  for (const r of rows) {
    if (r.timeouts > 0) notes.push(`${r.name}: ${r.timeouts} of the errors are timeouts (no response within autocannon's 10 s).`);
  }
  // Said in the table's own words, so a figure from a busy machine is not read as the service's ceiling.
  if (m.loadavg_1m > m.nproc) {
    notes.push(`The machine was busy with other work (load average ${m.loadavg_1m} on ${m.nproc} CPUs at the start); figures are lower than on an idle machine.`);
  }
  const when = new Date();
  const report = { benchmark: 'control', date: when.toISOString(), machine: m, settings, notes, rows };
  const stamp = when.toISOString().replace(/[:.]/g, '-');
  const jsonPath = writeJson(`control-${stamp}.json`, report);
  writeJson('control-latest.json', report);

  const table = [
    '| endpoint | rps (mean) | p50 ms | p99 ms | requests | errors | non-2xx |',
    '|---|---:|---:|---:|---:|---:|---:|',
    ...rows.map((r) => `| ${r.name} | ${r.rps} | ${r.latency_ms.p50} | ${r.latency_ms.p99} | ${r.requests} | ${r.errors} | ${r.non2xx} |`),
  ];
  writeResults(
    'control',
    'Control API',
    [
      '`npm run bench:control` (bench/control.mjs): `poolgate start` with every role in one process on the embedded',
      'PGlite store, a team bootstrapped through `poolgate admin bootstrap`, pools created through',
      '`POST /api/v1/pools`, budgets through `poolgate admin budget create/attach`. Each row is one autocannon run',
      'with a bearer token holding every ability, after a warm-up run; the mint row sends `{"label":"bench"}` and',
      'cycles over the pools, so each request writes one key row and one change notification.',
      '',
      `- settings: ${settings.duration_s} s per row, ${settings.connections} connections, ${settings.warmup_s} s warm-up, no pipelining, service log level \`${settings.log_level}\``,
      '',
      ...table,
      ...(notes.length ? ['', 'Notes:', '', ...notes.map((n) => `- ${n}`)] : []),
    ].join('\n'),
    { command: benchCommand('npm run bench:control'), m, date: report.date },
  );
  log(`wrote ${jsonPath}`);
}

main().catch((err) => {
  process.stderr.write(`bench:control failed: ${err.stack ?? err}\n`);
  process.exit(1);
});
