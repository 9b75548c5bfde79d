// Pool policies through the real data plane and lock API (uWS listening on `::`, so clients come from
// 127.0.0.1 and from ::1): IP allowlist with trusted-proxy X-Forwarded-For, access proxy, HMAC request
// signing with nonce replay protection, JWT against a loopback JWKS server and static keys. Every
// refusal happens before the origin and before a slot, and is counted in Prometheus.
import t from 'tap';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Pool, request } from 'undici';
import { exportJWK, exportSPKI, generateKeyPair, SignJWT, type CryptoKey } from 'jose';
import { startTestService, type TestService } from './helpers/service.js';
import { TestClock } from './helpers/test-clock.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { signRequest } from '../src/index.js';

let origin: Origin;
let svc: TestService;
let v4: Pool;
let v6: Pool;
let lock4: Pool;
let lock6: Pool;
let token: string;
let teamId: number;
let jwks: Server;
let jwksUrl: string;
let signer: { privateKey: CryptoKey; publicKey: CryptoKey };
let stranger: { privateKey: CryptoKey; publicKey: CryptoKey };

/** The service's clock: the JWT expiry test moves it past a token's exp instead of sleeping. */
const clock = new TestClock();

t.before(async () => {
  origin = await startOrigin();
  svc = await startTestService({
    now: clock.now,
    overrides: { host: '::', originCaFile: origin.caFile, accessLogFile: '/dev/null', trustedProxies: '127.0.0.1/32' },
  });
  const boot = await svc.bootstrap();
  token = boot.token;
  teamId = boot.team.id;
  const proxyPort = svc.service.ports.proxy!;
  const lockPort = svc.service.ports.lock!;
  v4 = new Pool(`http://127.0.0.1:${proxyPort}`, { connections: 8 });
  v6 = new Pool(`http://[::1]:${proxyPort}`, { connections: 8 });
  lock4 = new Pool(`http://127.0.0.1:${lockPort}`, { connections: 4 });
  lock6 = new Pool(`http://[::1]:${lockPort}`, { connections: 4 });
  signer = await generateKeyPair('ES256');
  stranger = await generateKeyPair('ES256');
  const jwk = { ...(await exportJWK(signer.publicKey)), kid: 'k1', alg: 'ES256', use: 'sig' };
  jwks = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ keys: [jwk] }));
  });
  await new Promise<void>((r) => jwks.listen(0, '127.0.0.1', r));
  jwksUrl = `http://127.0.0.1:${(jwks.address() as AddressInfo).port}/.well-known/jwks.json`;
});
t.teardown(async () => {
  await Promise.all([v4, v6, lock4, lock6].map((p) => p?.close()));
  await svc?.close();
  await origin?.close();
  jwks?.close();
});

async function createPool(sub: string, settings: Record<string, unknown>, requireKey = false): Promise<number> {
  const sql = svc.service.sql;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, require_key) VALUES ($1, $2, $2, 'http', $3, $4, $5) RETURNING id`,
    [teamId, sub, origin.url, new URL(origin.url).host, requireKey],
  );
  await sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  const res = await svc.api('PATCH', `/api/v1/pools/${sub}/settings`, { token, body: { settings } });
  if (res.status !== 200) throw new Error(`settings refused: ${JSON.stringify(res.body)}`);
  await svc.service.dataplane!.snapshots.reload();
  return rows[0]!.id;
}

async function mintKey(sub: string): Promise<{ key: string; secret?: string }> {
  const res = await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token, body: {} });
  await svc.service.dataplane!.snapshots.reload();
  return { key: res.body.data.key, secret: res.body.data.signing_secret };
}

interface Res {
  status: number;
  json: any;
  headers: Record<string, unknown>;
}

async function send(pool: Pool, host: string, path: string, o: { method?: string; headers?: Record<string, string>; body?: string | Buffer } = {}): Promise<Res> {
  const res = await pool.request({ path, method: (o.method ?? 'GET') as 'GET', headers: { host, ...o.headers }, body: o.body });
  const text = await res.body.text();
  let json: any = text;
  try {
    json = JSON.parse(text);
  } catch {
    /* keep text */
  }
  return { status: res.statusCode, json, headers: res.headers };
}

const call = (via: Pool, sub: string, path: string, o: Parameters<typeof send>[3] = {}) => send(via, `${sub}.pools.localhost`, path, o);
const acquire = (via: Pool, sub: string, o: Parameters<typeof send>[3] = {}) =>
  send(via, 'lock.localhost', `/pools/${sub}/lock/acquire`, { method: 'POST', ...o });

async function refusals(pool: string, policy: string, reason: string): Promise<number> {
  const res = await request(`http://127.0.0.1:${svc.service.ports.metrics}/metrics`);
  const text = await res.body.text();
  const line = text.split('\n').find((l) => l.startsWith(`poolgate_policy_refusals_total{pool="${pool}",policy="${policy}",reason="${reason}"}`));
  return line ? Number(line.split(' ').pop()) : 0;
}

/** Runs `fn` and says whether the origin saw a request and whether a slot was held meanwhile. */
async function untouched(poolId: number, fn: () => Promise<Res>): Promise<Res> {
  const before = origin.count;
  const res = await fn();
  t.equal(origin.count, before, 'the origin saw nothing');
  t.equal(svc.service.dataplane!.governor.state(poolId).inFlight, 0, 'no slot is held');
  return res;
}

t.test('IP allowlist: IPv4 and IPv6 clients; X-Forwarded-For only from a trusted proxy (rightmost untrusted)', async (t) => {
  const id = await createPool('pol-ip', { ipAllowlist: ['10.0.0.0/8', '::1/128'] });
  t.equal((await call(v6, 'pol-ip', '/a')).status, 200, '::1 is in the list');
  const miss = await untouched(id, () => call(v4, 'pol-ip', '/a'));
  t.equal(miss.status, 403, '127.0.0.1 is not');
  t.same(miss.json, { error: 'forbidden', message: miss.json.message });
  t.equal((await call(v4, 'pol-ip', '/a', { headers: { 'x-forwarded-for': '10.1.2.3' } })).status, 200, 'from the trusted proxy, the forwarded client counts');
  t.equal((await call(v4, 'pol-ip', '/a', { headers: { 'x-forwarded-for': '10.1.2.3, 192.168.7.7' } })).status, 403, 'the rightmost untrusted hop is the client, not a spoofed left entry');
  t.equal((await call(v4, 'pol-ip', '/a', { headers: { 'x-forwarded-for': '192.168.7.7, 10.1.2.3, 127.0.0.1' } })).status, 200, 'trusted hops are skipped from the right');
  t.equal((await call(v4, 'pol-ip', '/a', { headers: { 'x-forwarded-for': 'garbage' } })).status, 403, 'an unparsable chain falls back to the socket');

  await createPool('pol-ip4', { ipAllowlist: ['10.0.0.0/8'] });
  t.equal((await call(v6, 'pol-ip4', '/a', { headers: { 'x-forwarded-for': '10.1.2.3' } })).status, 403, 'a forwarded address from an untrusted peer (::1) is ignored');
  t.ok((await refusals('pol-ip', 'ip_allowlist', 'not_allowed')) >= 3, 'refusals are counted by pool, policy and reason');

  t.equal((await acquire(lock6, 'pol-ip')).status, 200, 'lock API: ::1 may acquire');
  const lockMiss = await acquire(lock4, 'pol-ip');
  t.equal(lockMiss.status, 403);
  t.equal(lockMiss.json.error, 'unauthorized', 'lock API: an allowlist miss is 403 unauthorized');
});

t.test('access proxy: identity trusted only from the proxy; direct or spoofed callers are refused', async (t) => {
  const id = await createPool('pol-ap', { accessProxy: { proxies: ['127.0.0.1/32'] } });
  origin.reset();
  const ok = await call(v4, 'pol-ap', '/who', { headers: { 'x-auth-request-user': 'alice@example.test' } });
  t.equal(ok.status, 200);
  t.equal(origin.requests[0]!.headers['x-auth-request-user'], 'alice@example.test', 'the proxy-set identity reaches the origin');
  const noId = await untouched(id, () => call(v4, 'pol-ap', '/who'));
  t.equal(noId.status, 401, 'the proxy sent no identity');
  const spoof = await untouched(id, () => call(v6, 'pol-ap', '/who', { headers: { 'x-auth-request-user': 'admin', 'x-forwarded-for': '127.0.0.1' } }));
  t.equal(spoof.status, 403, 'an identity header (and forwarded address) from a non-proxy peer is refused');
  t.equal(await refusals('pol-ap', 'access_proxy', 'untrusted_source'), 1);
  // An identity header named like a property of every object is read as a header: absent is no identity, not a 5xx.
  await createPool('pol-ap-ctor', { accessProxy: { proxies: ['127.0.0.1/32'], header: 'constructor' } });
  t.equal((await call(v4, 'pol-ap-ctor', '/who')).status, 401, 'no identity header sent');
  t.equal((await call(v4, 'pol-ap-ctor', '/who', { headers: { constructor: 'alice' } })).status, 200, 'the identity header sent');
});

t.test('HMAC: signed requests pass; bad, stale, tampered or replayed ones are 401 before a slot', async (t) => {
  const id = await createPool('pol-hmac', { originSigning: true, signedBodyLimit: 64 * 1024 }, true);
  const { key, secret } = await mintKey('pol-hmac');
  t.match(secret, /^pks_/, 'minting a key on a signing pool returns its signing_secret');
  const body = JSON.stringify({ hello: 'world' });
  const sign = (method: string, target: string, b?: string, extra: Partial<Parameters<typeof signRequest>[0]> = {}) => ({
    'x-service-key': key,
    ...signRequest({ secret: secret!, method, target, body: b, ...extra }),
  });

  t.equal((await call(v4, 'pol-hmac', '/get?b=2&a=1', { headers: sign('GET', '/get?b=2&a=1') })).status, 200, 'a signed GET with a query');
  origin.reset();
  const postHeaders = { ...sign('POST', '/items', body), 'content-type': 'application/json' };
  const post = await call(v4, 'pol-hmac', '/items', { method: 'POST', headers: postHeaders, body });
  t.equal(post.status, 200, 'a signed POST');
  t.equal(origin.requests[0]!.bodyBytes, Buffer.byteLength(body), 'the buffered body reaches the origin whole');

  const replay = await untouched(id, () => call(v4, 'pol-hmac', '/items', { method: 'POST', headers: postHeaders, body }));
  t.equal(replay.status, 401);
  t.equal(replay.json.message, 'nonce replay');
  const tampered = await untouched(id, () => call(v4, 'pol-hmac', '/items', { method: 'POST', headers: sign('POST', '/items', body), body: body.replace('world', 'WORLD') }));
  t.equal(tampered.status, 401, 'a changed body breaks the signature');
  t.equal((await call(v4, 'pol-hmac', '/other', { headers: sign('GET', '/get') })).status, 401, 'another path breaks it');
  t.equal((await call(v4, 'pol-hmac', '/get', { headers: sign('GET', '/get', undefined, { secret: 'pks_wrong' }) })).status, 401, 'another secret');
  const stale = await call(v4, 'pol-hmac', '/get', { headers: sign('GET', '/get', undefined, { now: Date.now() - 301_000 }) });
  t.equal(stale.status, 401);
  t.match(stale.json.message, /window/);
  t.equal((await call(v4, 'pol-hmac', '/get', { headers: { 'x-service-key': key } })).status, 401, 'unsigned');
  const big = 'x'.repeat(70 * 1024);
  t.equal((await call(v4, 'pol-hmac', '/items', { method: 'POST', headers: sign('POST', '/items', big), body: big })).status, 413, 'a signed body over signedBodyLimit');
  t.equal(await refusals('pol-hmac', 'hmac', 'nonce_replay'), 1);

  const lockBody = JSON.stringify({ waitMs: 0 });
  const lockHeaders = { ...sign('POST', '/pools/pol-hmac/lock/acquire', lockBody), 'content-type': 'application/json' };
  const granted = await acquire(lock4, 'pol-hmac', { headers: lockHeaders, body: lockBody });
  t.equal(granted.status, 200, 'lock API: a signed acquire');
  await send(lock4, 'lock.localhost', `/pools/pol-hmac/lock/${granted.json.slotId}/release`, { method: 'POST', headers: { 'x-service-key': key } });
  const lockReplay = await acquire(lock4, 'pol-hmac', { headers: lockHeaders, body: lockBody });
  t.equal(lockReplay.status, 401);
  t.same(lockReplay.json.error, 'unauthorized');
  t.equal(lockReplay.json.message, 'nonce replay', 'lock API: nonce replay is 401 unauthorized');
});

t.test('JWT: JWKS on loopback and static keys; expired, wrong audience, foreign key and missing tokens are 401', async (t) => {
  const id = await createPool('pol-jwt', { jwt: { jwksUrl, issuer: 'https://idp.test', audience: 'pool-api', requiredClaims: ['sub'], clockSkewSec: 5 } }, true);
  const { key } = await mintKey('pol-jwt');
  const jwt = (o: { aud?: string; exp?: number; with?: CryptoKey; sub?: boolean } = {}) => {
    const s = new SignJWT(o.sub === false ? {} : { sub: 'svc-1' })
      .setProtectedHeader({ alg: 'ES256', kid: 'k1' })
      .setIssuer('https://idp.test')
      .setAudience(o.aud ?? 'pool-api')
      .setIssuedAt()
      .setExpirationTime(o.exp ?? Math.floor(Date.now() / 1000) + 60);
    return s.sign(o.with ?? signer.privateKey);
  };
  const h = async (tok: string) => ({ 'x-service-key': key, authorization: `Bearer ${tok}` });
  t.equal((await call(v4, 'pol-jwt', '/j', { headers: await h(await jwt()) })).status, 200, 'a valid token');
  const expired = await untouched(id, async () => call(v4, 'pol-jwt', '/j', { headers: await h(await jwt({ exp: Math.floor(Date.now() / 1000) - 60 })) }));
  t.equal(expired.status, 401);
  t.match(expired.json.message, /expired/);
  t.equal((await call(v4, 'pol-jwt', '/j', { headers: await h(await jwt({ aud: 'other' })) })).status, 401, 'wrong audience');
  t.equal((await call(v4, 'pol-jwt', '/j', { headers: await h(await jwt({ sub: false })) })).status, 401, 'a required claim missing');
  t.equal((await call(v4, 'pol-jwt', '/j', { headers: await h(await jwt({ with: stranger.privateKey })) })).status, 401, 'signed by another key');
  t.equal((await call(v4, 'pol-jwt', '/j', { headers: { 'x-service-key': key } })).status, 401, 'no token');
  t.equal((await call(v4, 'pol-jwt', '/j', { headers: { authorization: `Bearer ${key}` } })).status, 401, 'the key in Authorization leaves no room for the JWT');
  t.equal(await refusals('pol-jwt', 'jwt', 'expired'), 1);

  await createPool('pol-jwt-pem', { jwt: { keys: [await exportSPKI(signer.publicKey)], header: 'x-service-jwt', algorithms: ['ES256'] } }, true);
  const pemKey = await mintKey('pol-jwt-pem');
  t.equal((await call(v4, 'pol-jwt-pem', '/j', { headers: { authorization: `Bearer ${pemKey.key}`, 'x-service-jwt': await jwt() } })).status, 200, 'a PEM key, the token in a configured header');
  t.equal((await call(v4, 'pol-jwt-pem', '/j', { headers: { authorization: `Bearer ${pemKey.key}`, 'x-service-jwt': await jwt({ with: stranger.privateKey }) } })).status, 401);

  const lockOk = await acquire(lock4, 'pol-jwt', { headers: await h(await jwt()) });
  t.equal(lockOk.status, 200, 'lock API: a valid token');
  const lockBad = await acquire(lock4, 'pol-jwt', { headers: await h(await jwt({ aud: 'other' })) });
  t.equal(lockBad.status, 401);
  t.equal(lockBad.json.error, 'unauthorized');
});

t.test('turning a policy off through the settings applies at once', async (t) => {
  await createPool('pol-off', { ipAllowlist: ['10.0.0.0/8'] });
  t.equal((await call(v4, 'pol-off', '/a')).status, 403);
  await svc.api('PATCH', '/api/v1/pools/pol-off/settings', { token, body: { settings: { ipAllowlist: [] } } });
  await svc.service.dataplane!.snapshots.reload();
  t.equal((await call(v4, 'pol-off', '/a')).status, 200);
});

t.test('policy settings that cannot be applied (a hand edit of the row) close the pool rather than open it', async (t) => {
  const id = await createPool('pol-broken', { ipAllowlist: ['10.0.0.0/8'] });
  await svc.service.sql.query(`UPDATE pools SET settings = '{"ipAllowlist":["not-a-cidr"]}'::jsonb WHERE id = $1`, [id]);
  await svc.service.dataplane!.snapshots.reload();
  const res = await untouched(id, () => call(v6, 'pol-broken', '/a'));
  t.equal(res.status, 503);
  t.match(res.json.message, /cannot be applied/);
  t.equal(await refusals('pol-broken', 'settings', 'misconfigured'), 1);
});

t.test('JWT: a token verified once is remembered only until it expires', async (t) => {
  await createPool('pol-jwt-exp', { jwt: { keys: [await exportSPKI(signer.publicKey)], clockSkewSec: 0 } });
  const exp = Math.floor(clock.now().getTime() / 1000) + 2;
  const tok = await new SignJWT({ sub: 's' }).setProtectedHeader({ alg: 'ES256' }).setExpirationTime(exp).sign(signer.privateKey);
  const headers = { authorization: `Bearer ${tok}` };
  t.equal((await call(v4, 'pol-jwt-exp', '/j', { headers })).status, 200);
  t.equal((await call(v4, 'pol-jwt-exp', '/j', { headers })).status, 200, 'again (from the verified-token cache)');
  clock.advance(exp * 1000 - clock.now().getTime() + 50);
  const late = await call(v4, 'pol-jwt-exp', '/j', { headers });
  t.equal(late.status, 401, 'refused once exp has passed, cache or not');
  t.match(late.json.message, /expired/);
});
