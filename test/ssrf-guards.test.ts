// The SSRF guard beyond pool creation: a JWT policy's JWKS URL checked when written (API and admin CLI)
// and again at fetch time, origin connections re-checked at connect time (DNS rebinding), and
// X-Forwarded-* headers taken from the client only through a trusted proxy.
import t from 'tap';
import { createServer as createTcpServer, type Server as TcpServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { Pool } from 'undici';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SignJWT } from 'jose';
import { until } from './helpers/until.js';
import { startTestService, type TestService } from './helpers/service.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { runAdmin } from '../src/admin/commands.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { jwksFetcher } from '../src/policies/jwt.js';

const PUBLIC = '93.184.216.34';
/** Names the guarded service resolves; tests repoint them to play DNS rebinding. */
const dns: Record<string, string[]> = {
  'jwks.example.com': [PUBLIC],
  'origin.example.com': [PUBLIC],
  'jwt-pool.example.com': [PUBLIC],
  'write-pool.example.com': [PUBLIC],
  'loopback.example.com': ['127.0.0.1'],
};

/** A TCP listener on loopback that only counts connections: proof that nothing dialled it. */
/** The guarded service's access log: where the reason for a 502 goes (issue 15 item 10), not to the client. */
const accessLogFile = join(mkdtempSync(join(tmpdir(), 'poolgate-ssrf-')), 'access.log');
let trap: TcpServer;
let trapPort = 0;
let trapped = 0;
let guarded: TestService;
let token: string;
let teamSlug: string;
let teamId: number;

t.before(async () => {
  trap = createTcpServer((s) => {
    trapped++;
    s.destroy();
  });
  await new Promise<void>((r) => trap.listen(0, '127.0.0.1', r));
  trapPort = (trap.address() as AddressInfo).port;
  guarded = await startTestService({
    overrides: { allowPrivateTargets: false, accessLogFile },
    lookup: async (host) => {
      const found = dns[host];
      if (!found) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
      return found;
    },
  });
  const boot = await guarded.bootstrap();
  token = boot.token;
  teamSlug = boot.team.slug;
  teamId = boot.team.id;
});
t.teardown(async () => {
  await guarded?.close();
  trap?.close();
});

/** A pool whose origin is `host` (one pool per name: the same origin again would be the same pool). */
async function newPool(host: string): Promise<string> {
  const res = await guarded.api('POST', '/api/v1/pools', { token, body: { origin: `https://${host}:${trapPort}` } });
  if (res.status !== 201) throw new Error(`pool create failed: ${JSON.stringify(res.body)}`);
  return res.body.data.subdomain as string;
}

t.test('a JWKS URL naming a private or loopback host is refused when written, and nothing is written', async (t) => {
  const sub = await newPool('write-pool.example.com');
  for (const url of ['https://127.0.0.1/keys', 'https://[::1]/keys', 'https://10.0.0.5/keys', 'https://loopback.example.com/keys', 'https://localhost/keys']) {
    const res = await guarded.api('PATCH', `/api/v1/pools/${sub}/settings`, { token, body: { max_concurrent: 3, settings: { jwt: { jwksUrl: url } } } });
    t.equal(res.status, 422, url);
    t.match(res.body.message, /^settings\.jwt\.jwksUrl: .*refused/, url);
  }
  const view = await guarded.api('GET', `/api/v1/pools/${sub}/settings`, { token });
  t.equal(view.body.data.settings.jwt, null, 'no JWT policy written');
  t.not(view.body.data.max_concurrent, 3, 'the rest of the patch was not written either');

  const cli = await runAdmin(['pool', 'set', sub, '--team', teamSlug, '--jwt', JSON.stringify({ jwksUrl: 'https://127.0.0.1/keys' })], {
    config: guarded.config, sql: guarded.service.sql, box: guarded.service.box, now: () => new Date(),
  });
  t.equal(cli.code, 2, 'admin pool set: a usage error');
  t.match(cli.stderr, /settings\.jwt\.jwksUrl: .*refused/);
  t.equal((await guarded.api('GET', `/api/v1/pools/${sub}/settings`, { token })).body.data.settings.jwt, null);
});

t.test('a JWKS host that resolves to loopback at fetch time is not dialled; the pool fails closed (503)', async (t) => {
  const sub = await newPool('jwt-pool.example.com');
  const set = await guarded.api('PATCH', `/api/v1/pools/${sub}/settings`, {
    token,
    body: { require_key: false, settings: { jwt: { jwksUrl: `https://jwks.example.com:${trapPort}/keys` } } },
  });
  t.equal(set.status, 200, 'a public JWKS host is accepted');
  dns['jwks.example.com'] = ['127.0.0.1'];
  t.teardown(() => {
    dns['jwks.example.com'] = [PUBLIC];
  });
  await guarded.service.dataplane!.snapshots.reload();
  const jwt = await new SignJWT({ sub: 'u' }).setProtectedHeader({ alg: 'HS256' }).setExpirationTime('5m').sign(new Uint8Array(32));
  const before = trapped;
  const proxy = new Pool(guarded.proxyUrl!);
  t.teardown(() => proxy.close());
  const res = await proxy.request({ path: '/', method: 'GET', headers: { host: `${sub}.pools.localhost`, authorization: `Bearer ${jwt}` } });
  const body = (await res.body.json()) as { error: string };
  t.equal(res.statusCode, 503);
  t.equal(body.error, 'unavailable');
  t.equal(trapped, before, 'no connection reached the loopback address');
});

t.test('the JWKS fetcher dials a loopback answer only with allowPrivateTargets', async (t) => {
  const toLoopback = async () => ['127.0.0.1'];
  const url = `http://jwks.example.com:${trapPort}/keys`;
  const opts = { headers: new Headers(), method: 'GET' as const, redirect: 'manual' as const, signal: AbortSignal.timeout(5000) };
  const refused = jwksFetcher({ allowPrivate: false, lookup: toLoopback });
  t.teardown(() => refused.close());
  const before = trapped;
  const err = await refused.fetch(url, opts).then(() => null, (e: Error & { cause?: { code?: string; message?: string } }) => e);
  t.equal(err?.cause?.code, 'ETARGETREFUSED');
  t.match(err?.cause?.message, /jwks\.example\.com resolves to 127\.0\.0\.1/);
  t.equal(trapped, before, 'refused before dialling');
  // Control: the same name and resolver with private targets allowed does reach the listener.
  const allowed = jwksFetcher({ allowPrivate: true, lookup: toLoopback });
  t.teardown(() => allowed.close());
  await allowed.fetch(url, opts).catch(() => {});
  t.equal(trapped, before + 1, 'allowPrivateTargets: dialled');
});

t.test('an origin that resolves to loopback at connect time is refused: 502, the reason in the access log only, slot released', async (t) => {
  const sub = await newPool('origin.example.com');
  t.equal((await guarded.api('PATCH', `/api/v1/pools/${sub}/settings`, { token, body: { require_key: false, max_concurrent: 1 } })).status, 200);
  dns['origin.example.com'] = ['127.0.0.1'];
  t.teardown(() => {
    dns['origin.example.com'] = [PUBLIC];
  });
  await guarded.service.dataplane!.snapshots.reload();
  const proxy = new Pool(guarded.proxyUrl!);
  t.teardown(() => proxy.close());
  const before = trapped;
  // Twice with no queueing on a one-slot pool: a slot kept by the first would make the second a 429.
  for (let i = 0; i < 2; i++) {
    const res = await proxy.request({ path: '/', method: 'GET', headers: { host: `${sub}.pools.localhost`, 'x-service-no-queue': '1' } });
    const body = (await res.body.json()) as { error: string; message: string };
    t.equal(res.statusCode, 502, `request ${i + 1}`);
    t.equal(body.error, 'upstream_unreachable');
    t.equal(body.message, 'the origin could not be reached', 'the client is not told where the name resolved');
  }
  t.equal(trapped, before, 'no connection reached the loopback address');
  // The access log file gets its lines within a second (access-log.ts): awaited, not slept for.
  const logged = () => {
    try {
      return readFileSync(accessLogFile, 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l)).filter((l) => l.pool === sub);
    } catch {
      return []; // not written yet, or a line half-written
    }
  };
  const lines = await until('both refusals in the access log', () => logged().length >= 2 && logged());
  t.equal(lines.length, 2);
  for (const l of lines) {
    t.equal(l.status, 502);
    t.match(l.detail, /origin\.example\.com resolves to 127\.0\.0\.1.*refused at connect time/, 'the operator reads the reason in the access log');
  }
});

t.test('an IP-literal origin stored before the guard (no lookup runs for it) is refused at connect time too', async (t) => {
  const sql = guarded.service.sql;
  const origin = `https://127.0.0.1:${trapPort}`;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key)
     VALUES ($1, 'literal', 'literal', 'http', $2, $3, 1, false) RETURNING id`,
    [teamId, origin, new URL(origin).host],
  );
  await sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await guarded.service.dataplane!.snapshots.reload();
  const proxy = new Pool(guarded.proxyUrl!);
  t.teardown(() => proxy.close());
  const before = trapped;
  const res = await proxy.request({ path: '/', method: 'GET', headers: { host: 'literal.pools.localhost' } });
  const body = (await res.body.json()) as { error: string; message: string };
  t.equal(res.statusCode, 502);
  t.equal(body.message, 'the origin could not be reached');
  t.equal(trapped, before, 'not dialled');
});

t.test('X-Forwarded-* from a client are replaced; from a trusted proxy they are kept', async (t) => {
  const origin: Origin = await startOrigin();
  t.teardown(() => origin.close());
  // 127.0.0.2 (a loopback source address) plays the trusted proxy; plain 127.0.0.1 is a client.
  const svc = await startTestService({ overrides: { originCaFile: origin.caFile, trustedProxies: '127.0.0.2/32' } });
  t.teardown(() => svc.close());
  const boot = await svc.bootstrap();
  const sql = svc.service.sql;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key)
     VALUES ($1, 'xff', 'xff', 'http', $2, $3, 5, false) RETURNING id`,
    [boot.team.id, origin.url, new URL(origin.url).host],
  );
  await sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await svc.service.dataplane!.snapshots.reload();
  const forged = { 'x-forwarded-for': '203.0.113.9', 'x-forwarded-proto': 'https', 'x-forwarded-host': 'bank.example' };

  const seen = async (localAddress: string) => {
    const proxy = new Pool(svc.proxyUrl!, { localAddress });
    try {
      const res = await proxy.request({ path: '/echo', method: 'GET', headers: { host: 'xff.pools.localhost', ...forged } });
      t.equal(res.statusCode, 200);
      return ((await res.body.json()) as { headers: Record<string, string> }).headers;
    } finally {
      await proxy.close();
    }
  };

  const fromClient = await seen('127.0.0.1');
  t.equal(fromClient['x-forwarded-for'], '127.0.0.1', 'a client cannot forge the chain');
  t.equal(fromClient['x-forwarded-proto'], 'http');
  t.equal(fromClient['x-forwarded-host'], 'xff.pools.localhost');

  const fromProxy = await seen('127.0.0.2');
  t.equal(fromProxy['x-forwarded-for'], '203.0.113.9, 127.0.0.2', 'the trusted proxy\'s chain, then the proxy');
  t.equal(fromProxy['x-forwarded-proto'], 'https');
  t.equal(fromProxy['x-forwarded-host'], 'bank.example');
});
