// Policies benchmark: the per-request cost of each pool policy. One https origin (uWS, self-signed), one
// poolgate (every role, fresh PostgreSQL database), and pools that differ only in their policies: none,
// IP allowlist, access proxy, HMAC (every request freshly signed), JWT (ES256, static key), all four.
// Each is driven by autocannon in turn, side by side in one run.
// Usage: npm run bench:policies   (env BENCH_DURATION seconds, default 6; BENCH_WARMUP, default 2;
// BENCH_CONNECTIONS, default 50; -- --write-results). Writes bench/out/policies-*.json and, with --write-results,
// the bench:policies section of bench/RESULTS.md.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadavg } from 'node:os';
import pg from 'pg';
import { request } from 'undici';
import { exportSPKI, generateKeyPair, SignJWT } from 'jose';
import { api, startPoolgate } from './lib/poolgate.mjs';
import { measure } from './lib/load.mjs';
import { benchCommand, machine, writeJson, writeResults } from './lib/results.mjs';
import { startTlsOrigin } from './lib/proxy-targets.mjs';
import { freshDatabase } from './lib/fresh-database.mjs';
import { signRequest } from '../dist/src/index.js';
import { hmacPolicy } from '../dist/src/policies/hmac.js';
import { ipAllowlistPolicy } from '../dist/src/policies/ip-allowlist.js';
import { accessProxyPolicy } from '../dist/src/policies/access-proxy.js';
import { jwtPolicy } from '../dist/src/policies/jwt.js';
import { MemoryNonceStore } from '../dist/src/policies/nonce-store.js';

function intEnv(name, def, min) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return def;
  if (!/^\d+$/.test(raw) || Number(raw) < min) throw new Error(`${name} must be an integer ≥ ${min}, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

const settings = {
  duration_s: intEnv('BENCH_DURATION', 6, 1),
  warmup_s: intEnv('BENCH_WARMUP', 2, 0),
  connections: intEnv('BENCH_CONNECTIONS', 50, 1),
  origin_host: '127.0.0.2',
  pool_max_concurrent: 10_000,
  store: 'PostgreSQL (fresh database on the local server)',
  access_log: 'sampled 1 in 1000 to a file',
};
const PG_URL = process.env.POOLGATE_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const log = (msg) => process.stderr.write(`bench:policies: ${msg}\n`);

const round = (n, d = 2) => Math.round(n * 10 ** d) / 10 ** d;

/**
 * Each policy's check alone, in this process, on the compiled policy the data plane runs: µs per check
 * (median of 5 rounds), so the cost is visible apart from the end-to-end noise of a shared machine.
 */
async function microCosts() {
  const N = 20_000;
  const req = { pool: { id: 1 }, key: { id: 1, signingSecret: 'pks_bench' }, keyInAuthorization: false, method: 'GET', path: '/', query: '', peer: '127.0.0.1', client: '127.0.0.1', headers: {} };
  const kp = await generateKeyPair('ES256');
  const pem = await exportSPKI(kp.publicKey);
  const token = await new SignJWT({ sub: 'bench' }).setProtectedHeader({ alg: 'ES256' }).setExpirationTime('1h').sign(kp.privateKey);
  const freshTokens = await Promise.all(Array.from({ length: 500 }, (_, i) => new SignJWT({ sub: `b${i}` }).setProtectedHeader({ alg: 'ES256' }).setExpirationTime('1h').sign(kp.privateKey)));
  const cases = [
    { name: 'IP allowlist (4 CIDRs)', n: N, policy: ipAllowlistPolicy(['10.0.0.0/8', '192.168.0.0/16', '127.0.0.0/8', '::1/128']), req: () => req },
    { name: 'access proxy', n: N, policy: accessProxyPolicy({ proxies: ['127.0.0.1/32'] }), req: () => ({ ...req, headers: { 'x-auth-request-user': 'a' } }) },
    {
      name: 'HMAC verify + nonce (memory)',
      n: N,
      policy: hmacPolicy({ windowSec: 300, nonces: new MemoryNonceStore(), clock: Date.now }),
      prepare: (n) => Array.from({ length: n }, () => ({ ...req, headers: signRequest({ secret: 'pks_bench', method: 'GET', target: '/' }) })),
    },
    { name: 'JWT ES256, token seen before', n: N, policy: jwtPolicy({ keys: [pem], algorithms: ['ES256'] }), req: () => ({ ...req, headers: { authorization: `Bearer ${token}` } }) },
    { name: 'JWT ES256, new token each time', n: 500, policy: jwtPolicy({ keys: [pem], algorithms: ['ES256'] }), prepare: () => freshTokens.map((tk) => ({ ...req, headers: { authorization: `Bearer ${tk}` } })) },
  ];
  const out = [];
  for (const c of cases) {
    const rounds = [];
    for (let r = 0; r < 5; r++) {
      // New tokens must be new in every round: a fresh policy has an empty verified-token cache.
      const policy = c.name.includes('new token') ? jwtPolicy({ keys: [pem], algorithms: ['ES256'] }) : c.policy;
      const reqs = c.prepare ? c.prepare(c.n) : null;
      const t0 = performance.now();
      for (let i = 0; i < c.n; i++) {
        const v = await policy.check(reqs ? reqs[i] : c.req(), null);
        if (v !== null) throw new Error(`${c.name}: refused (${v.reason})`);
      }
      rounds.push(((performance.now() - t0) * 1000) / c.n);
    }
    rounds.sort((a, b) => a - b);
    out.push({ name: c.name, us_per_check: round(rounds[2], 2) });
    log(`${c.name}: ${round(rounds[2], 2)} µs per check`);
  }
  return out;
}

async function main() {
  const m = machine();
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-policies-'));
  const stops = [];
  const rows = [];
  try {
    const { origin, certFile, originUrl } = await startTlsOrigin(dir, settings.origin_host);
    stops.push(() => origin.stop());
    const db = await freshDatabase(PG_URL);
    stops.push(() => db.drop());
    const svc = await startPoolgate({
      DATABASE_URL: db.url,
      POOLGATE_ORIGIN_CA_FILE: certFile,
      POOLGATE_ALLOW_PRIVATE_TARGETS: 'true',
      POOLGATE_LOG_LEVEL: 'warn',
      POOLGATE_ACCESS_LOG_FILE: join(dir, 'access.log'),
      POOLGATE_ACCESS_LOG_SAMPLE: '1000',
    });
    stops.unshift(() => svc.stop());
    const boot = await svc.admin(['bootstrap', '--team', 'Bench', '--email', 'bench@bench.test', '--plan', 'business']);
    const sql = new pg.Client({ connectionString: db.url });
    await sql.connect();

    const jwtKeys = await generateKeyPair('ES256');
    const jwt = await new SignJWT({ sub: 'bench' })
      .setProtectedHeader({ alg: 'ES256' })
      .setIssuer('https://idp.bench')
      .setAudience('bench')
      .setExpirationTime('2h')
      .sign(jwtKeys.privateKey);
    const jwtPolicy = { keys: [await exportSPKI(jwtKeys.publicKey)], issuer: 'https://idp.bench', audience: 'bench', algorithms: ['ES256'], header: 'x-service-jwt' };
    const apPolicy = { proxies: ['127.0.0.1/32'] };
    const allow = ['10.0.0.0/8', '192.168.0.0/16', '127.0.0.0/8', '::1/128'];
    const variants = [
      { key: 'none', name: 'no policies', settings: {} },
      // The same pool with the client signing every request anyway (the headers are ignored): the fair
      // baseline for the HMAC rows, since autocannon's per-request signing costs CPU on this machine too.
      { key: 'none_signing', name: 'no policies, client signs anyway', settings: {}, clientSigns: true },
      { key: 'ip_allowlist', name: 'IP allowlist (4 CIDRs)', settings: { ipAllowlist: allow } },
      { key: 'access_proxy', name: 'access proxy', settings: { accessProxy: apPolicy } },
      { key: 'hmac', name: 'HMAC (signed per request, memory nonces)', settings: { originSigning: true } },
      { key: 'jwt', name: 'JWT (ES256, static key)', settings: { jwt: jwtPolicy } },
      { key: 'all', name: 'all four', settings: { ipAllowlist: allow, accessProxy: apPolicy, originSigning: true, jwt: jwtPolicy } },
    ];
    const proxyUrl = `http://127.0.0.1:${svc.listening.proxy}`;
    for (const v of variants) {
      const sub = `bench-${v.key.replaceAll('_', '-')}`;
      const { rows: made } = await sql.query(
        `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent) VALUES ($1, $2, $2, 'http', $3, $4, $5) RETURNING id`,
        [boot.team.id, sub, originUrl, new URL(originUrl).host, settings.pool_max_concurrent],
      );
      await sql.query(`SELECT pg_notify('poolgate_changes', $1)`, [`pool:${made[0].id}`]);
      const patched = await api(svc.controlUrl, boot.token, 'PATCH', `/api/v1/pools/${sub}/settings`, { settings: v.settings });
      if (patched.status !== 200) throw new Error(`settings of ${sub} → ${patched.status} ${JSON.stringify(patched.body)}`);
      const minted = await api(svc.controlUrl, boot.token, 'POST', `/api/v1/pools/${sub}/keys`, { label: 'bench' });
      if (minted.status !== 201) throw new Error(`mint → ${minted.status} ${JSON.stringify(minted.body)}`);
      v.sub = sub;
      v.headers = { host: `${sub}.pools.localhost`, 'x-service-key': minted.body.data.key };
      if (v.settings.accessProxy) v.headers['x-auth-request-user'] = 'bench@bench.test';
      if (v.settings.jwt) v.headers['x-service-jwt'] = jwt;
      v.secret = minted.body.data.signing_secret ?? (v.clientSigns ? 'pks_unused' : null);
    }
    await sql.end();

    // A fresh signature (timestamp, nonce) for every request: a repeated one would be a replay.
    const specFor = (v, duration) => {
      const spec = { name: v.name, url: `${proxyUrl}/`, headers: v.headers, connections: settings.connections, duration };
      if (v.secret) spec.setupRequest = (req) => ({ ...req, headers: { ...req.headers, ...signRequest({ secret: v.secret, method: 'GET', target: req.path ?? '/' }) } });
      return spec;
    };
    for (const v of variants) {
      for (let i = 0; ; i++) {
        const extra = v.secret ? signRequest({ secret: v.secret, method: 'GET', target: '/' }) : {};
        const res = await request(`${proxyUrl}/`, { headers: { ...v.headers, ...extra } });
        const body = await res.body.text();
        if (res.statusCode === 200) break;
        if (i > 50) throw new Error(`probe of ${v.sub} → ${res.statusCode} ${body}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    }

    const load = loadavg().map((x) => round(x));
    for (const v of variants) {
      if (settings.warmup_s > 0) await measure(specFor(v, settings.warmup_s));
      const a = await measure(specFor(v, settings.duration_s));
      rows.push({ variant: v.key, name: v.name, ...a });
      log(`${v.name}: ${a.rps} req/s, p50 ${a.latency_ms.p50} ms, p99 ${a.latency_ms.p99} ms, non-2xx ${a.non2xx}, errors ${a.errors}`);
    }
    const plain = rows.find((r) => r.variant === 'none');
    const signing = rows.find((r) => r.variant === 'none_signing');
    for (const r of rows) {
      // Rows whose client signs each request compare with the baseline whose client does the same.
      const base = r.variant === 'hmac' || r.variant === 'all' ? signing : plain;
      r.baseline = base.variant;
      r.rps_ratio = round(r.rps / base.rps);
      // Added service time per request: 1/throughput of a saturated server, minus the baseline's.
      r.added_us_per_request = round((1 / r.rps - 1 / base.rps) * 1e6, 1);
    }
    const micro = await microCosts();
    const out = { date: new Date().toISOString(), machine: m, loadavg_at_start_of_runs: load, settings, rows, micro };
    const file = writeJson(`policies-${out.date.replace(/[:.]/g, '-')}.json`, out);
    writeJson('policies-latest.json', out);
    const table = [
      '| pool policies | req/s | baseline | vs baseline | added µs/request | p50 ms | p99 ms | non-2xx |',
      '| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |',
      ...rows.map((r) =>
        r.variant === r.baseline
          ? `| ${r.name} | ${r.rps} | – | – | – | ${r.latency_ms.p50} | ${r.latency_ms.p99} | ${r.non2xx} |`
          : `| ${r.name} | ${r.rps} | ${r.baseline} | ${r.rps_ratio} | ${r.added_us_per_request} | ${r.latency_ms.p50} | ${r.latency_ms.p99} | ${r.non2xx} |`,
      ),
    ].join('\n');
    writeResults(
      'policies',
      'Policies',
      `Load average ${load.join(' / ')} (1/5/15 min) when the runs began.
autocannon, ${settings.connections} connections, ${settings.duration_s} s per pool after ${settings.warmup_s} s warm-up, GET / through poolgate
(every role in one process, ${settings.store}) to an https origin on ${settings.origin_host} (bench/lib/tls-origin.mjs: uWS where it loads, else node:https); the pools differ only in their
policies and run one after another in the same process. "added µs/request" is 1/throughput minus the no-policy pool's
(the server is saturated, so it approximates the CPU each policy adds). For the HMAC rows autocannon signs every request
(\`signRequest\`) on the same machine, so they are compared with the no-policy pool driven by the same signing client.
Raw: \`bench/out/${file.split('/').pop()}\`.
With a load average above the number of cores the end-to-end rows are dominated by other work on the machine
(rows can even beat their baseline); the per-check table below is the steadier measure of what each policy costs.

${table}

Each policy's check alone (in the benchmark process, on the same compiled policies; median of 5 rounds). The data
plane awaits none of them except a JWT that is not yet in its verified-token cache (and Redis nonces).

| policy check | µs per check |
| --- | ---: |
${micro.map((r) => `| ${r.name} | ${r.us_per_check} |`).join('\n')}
`,
      { command: benchCommand('npm run bench:policies'), m, date: out.date },
    );
    log(`wrote ${file}`);
  } finally {
    for (const s of stops) await s().catch((err) => log(`stop failed: ${err.message}`));
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
