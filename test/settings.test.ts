// Pool settings (an extension of the spec): GET|PATCH /api/v1/pools/{pool}/settings and `admin pool
// show|set`: defaults, whole-patch validation (nothing half-applied), cross-field rules, who may change
// them, the OpenAPI extension mark, and a change reaching the data plane within a second without a
// restart or a dropped request (lowering max_concurrent below the slots in flight).
import t from 'tap';
import { Pool } from 'undici';
import { until } from './helpers/until.js';
import { startTestService, type TestService } from './helpers/service.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { runAdmin } from '../src/admin/commands.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { DEFAULT_POOL_SETTINGS } from '../src/store/pool-settings.js';

let origin: Origin;
let svc: TestService;
let proxy: Pool;
let token: string;
let teamId: number;
let teamSlug: string;

t.before(async () => {
  origin = await startOrigin();
  svc = await startTestService({ overrides: { originCaFile: origin.caFile, accessLogFile: '/dev/null' } });
  const boot = await svc.bootstrap();
  token = boot.token;
  teamId = boot.team.id;
  teamSlug = boot.team.slug;
  proxy = new Pool(svc.proxyUrl!, { connections: 32 });
});
t.teardown(async () => {
  await proxy?.close();
  await svc?.close();
  await origin?.close();
});

async function createPool(sub: string, maxConcurrent = 10): Promise<number> {
  const sql = svc.service.sql;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent)
     VALUES ($1, $2, $2, 'http', $3, $4, $5) RETURNING id`,
    [teamId, sub, origin.url, new URL(origin.url).host, maxConcurrent],
  );
  await sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await svc.service.dataplane!.snapshots.reload();
  return rows[0]!.id;
}

async function call(sub: string, path: string, headers: Record<string, string> = {}, method = 'GET') {
  const res = await proxy.request({ path, method: method as 'GET', headers: { host: `${sub}.pools.localhost`, ...headers } });
  const text = await res.body.text();
  return { status: res.statusCode, text, headers: res.headers };
}

/** Polls until `ok` holds; returns the ms it took (fails past `limitMs`). */
async function within(limitMs: number, ok: () => Promise<boolean>): Promise<number> {
  const started = performance.now();
  while (!(await ok())) {
    if (performance.now() - started > limitMs) throw new Error(`not true within ${limitMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
  return performance.now() - started;
}

t.test('GET shows every setting with its default; PATCH changes columns and settings in one go', async (t) => {
  await createPool('set-basic');
  const got = await svc.api('GET', '/api/v1/pools/set-basic/settings', { token });
  t.equal(got.status, 200);
  t.same(got.body.data.settings, DEFAULT_POOL_SETTINGS, 'a new pool has the documented defaults');
  t.match(got.body.data, { subdomain: 'set-basic', max_concurrent: 10, require_key: true, async_enabled: false, async_on_queue: false });

  const patched = await svc.api('PATCH', '/api/v1/pools/set-basic/settings', {
    token,
    body: { max_concurrent: 20, settings: { queueTimeoutMs: 5000, ipAllowlist: ['10.0.0.0/8', '::1/128'], readMethods: ['POST'], readPaths: { POST: ['/search'] } } },
  });
  t.equal(patched.status, 200, JSON.stringify(patched.body));
  t.equal(patched.body.data.max_concurrent, 20);
  t.equal(patched.body.data.settings.queueTimeoutMs, 5000);
  t.same(patched.body.data.settings.ipAllowlist, ['10.0.0.0/8', '::1/128']);
  t.equal(patched.body.data.settings.queueLength, DEFAULT_POOL_SETTINGS.queueLength, 'untouched settings keep their value');

  const reset = await svc.api('PATCH', '/api/v1/pools/set-basic/settings', { token, body: { settings: { queueTimeoutMs: null, ipAllowlist: null } } });
  t.equal(reset.body.data.settings.queueTimeoutMs, DEFAULT_POOL_SETTINGS.queueTimeoutMs, 'null puts a setting back to its default');
  t.same(reset.body.data.settings.ipAllowlist, []);
  const pool = await svc.api('GET', '/api/v1/pools/set-basic', { token });
  t.equal(pool.body.data.max_concurrent, 20, 'the Pool resource shows the new max_concurrent');
});

t.test('a bad value is a 422 naming the field, and nothing of the patch is written', async (t) => {
  await createPool('set-invalid');
  const before = await svc.api('GET', '/api/v1/pools/set-invalid/settings', { token });
  const cases: Array<[unknown, RegExp]> = [
    [{ max_concurrent: 20, settings: { queueTimeoutMs: -1 } }, /queueTimeoutMs/],
    [{ max_concurrent: 0 }, /max_concurrent/],
    [{ settings: { bogus: 1 } }, /bogus/],
    [{ max_concurrent: 5, settings: { ipAllowlist: ['10.0.0.0/8', '300.1.1.1/8'] } }, /ipAllowlist\.1.*not an IPv4 or IPv6/],
    [{ settings: { renewIntervalMs: 30_000, leaseTermMs: 30_000 } }, /renewIntervalMs .* less than settings\.leaseTermMs/],
    [{ max_concurrent: 3, settings: { adaptiveMin: 4 } }, /adaptiveMin \(4\) must not exceed max_concurrent \(3\)/],
    [{ settings: { readPaths: { PUT: ['/x'] } } }, /readPaths: PUT not in settings\.readMethods/],
    [{ settings: { jwt: { issuer: 'x' } } }, /jwt: set exactly one of jwksUrl and keys/],
    [{ settings: { jwt: { keys: ['not a pem'] } } }, /jwt\.keys\.0: not a usable public key/],
    [{ settings: { accessProxy: { proxies: ['nope'] } } }, /accessProxy\.proxies\.0/],
    [{}, /fewer than 1|must NOT have fewer/],
  ];
  for (const [body, message] of cases) {
    const res = await svc.api('PATCH', '/api/v1/pools/set-invalid/settings', { token, body });
    t.equal(res.status, 422, JSON.stringify(body));
    t.match(res.body.message, message, JSON.stringify(body));
  }
  const after = await svc.api('GET', '/api/v1/pools/set-invalid/settings', { token });
  t.same(after.body.data, before.body.data, 'no case changed anything (max_concurrent included)');
});

t.test('async needs the Team or Business plan', async (t) => {
  const other = await svc.bootstrap({ plan: 'free' });
  const { rows } = await svc.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host) VALUES ($1, 'free-pool', 'set-free', 'http', $2, $3) RETURNING id`,
    [other.team.id, origin.url, new URL(origin.url).host],
  );
  t.ok(rows[0]);
  const res = await svc.api('PATCH', '/api/v1/pools/set-free/settings', { token: other.token, body: { async_enabled: true } });
  t.equal(res.status, 422);
  t.match(res.body.message, /Team or Business plan/);
});

t.test('who may read and change settings', async (t) => {
  await createPool('set-auth');
  const member = await svc.admin(['user', 'add', '--team', teamSlug, '--email', 'member@example.test', '--role', 'member']);
  t.ok(member.user.id);
  // Members cannot hold tokens here (only owners and admins create them), so make one for an admin and demote.
  await svc.admin(['user', 'add', '--team', teamSlug, '--email', 'admin2@example.test', '--role', 'admin']);
  const adminTok = await svc.admin(['token', 'create', '--team', teamSlug, '--user', 'admin2@example.test']);
  const readOnly = await svc.admin(['token', 'create', '--team', teamSlug, '--user', 'admin2@example.test', '--abilities', 'pools:read']);
  t.equal((await svc.api('PATCH', '/api/v1/pools/set-auth/settings', { token: adminTok.token, body: { max_concurrent: 4 } })).status, 200, 'an admin may');
  t.equal((await svc.api('GET', '/api/v1/pools/set-auth/settings', { token: readOnly.token })).status, 200, 'pools:read may read');
  t.equal((await svc.api('PATCH', '/api/v1/pools/set-auth/settings', { token: readOnly.token, body: { max_concurrent: 4 } })).status, 403, 'pools:read may not write');
  await svc.service.sql.query(`UPDATE users SET role = 'member' WHERE email = 'admin2@example.test'`);
  // The Control API drops its cached actors on this notification; a listener beside it sees it delivered.
  const feed: string[] = [];
  const unlisten = await svc.service.sql.listen(CHANGE_CHANNEL, (p) => feed.push(p));
  t.teardown(unlisten);
  await svc.service.sql.notify(CHANGE_CHANNEL, 'user:0');
  await until('the user change on the change feed', () => feed.includes('user:0'));
  const asMember = await svc.api('PATCH', '/api/v1/pools/set-auth/settings', { token: adminTok.token, body: { max_concurrent: 5 } });
  t.equal(asMember.status, 403, 'a member actor may not change settings even with pools:write');
  t.match(asMember.body.message, /owners and admins/);
  t.equal((await svc.api('GET', '/api/v1/pools/set-auth/settings', { token: null })).status, 401);
  const stranger = await svc.bootstrap();
  t.equal((await svc.api('GET', '/api/v1/pools/set-auth/settings', { token: stranger.token })).status, 404, "another team's pool is not found");
  t.equal((await svc.api('PATCH', '/api/v1/pools/set-auth/settings', { token: stranger.token, body: { max_concurrent: 9 } })).status, 404);
});

t.test('the OpenAPI document carries both operations, marked as an extension', async (t) => {
  const res = await svc.api('GET', '/api/v1/openapi.json');
  const path = res.body.paths['/api/v1/pools/{pool}/settings'];
  for (const op of [path.get, path.patch]) {
    t.equal(op['x-extension'], true);
    t.same(op.tags, ['extensions']);
    t.match(op.description, /Extension of the service spec/);
  }
  t.ok(path.patch.requestBody.content['application/json'].schema.properties.settings.properties.ipAllowlist, 'policies are in the PATCH schema');
});

t.test('admin pool show|set: one flag per setting, the same validation', async (t) => {
  await createPool('set-cli');
  const deps = { config: svc.config, sql: svc.service.sql, box: svc.service.box, now: () => new Date() };
  const help = await runAdmin(['pool', 'set', '--help'], deps);
  for (const flag of ['--max-concurrent', '--queue-timeout-ms', '--ip-allowlist', '--jwt', '--access-proxy', '--origin-signing', '--rpm-override', '--read-paths', '--reset']) {
    t.match(help.stdout, flag, `--help lists ${flag}`);
  }
  const set = await svc.admin(['pool', 'set', 'set-cli', '--team', teamSlug, '--max-concurrent', '20', '--queue-timeout-ms', '1500',
    '--ip-allowlist', '10.0.0.0/8,::1/128', '--rpm-override', '600', '--adaptive', 'false', '--read-methods', 'POST', '--read-paths', '{"POST":["/q"]}']);
  t.match(set, { max_concurrent: 20, settings: { queueTimeoutMs: 1500, ipAllowlist: ['10.0.0.0/8', '::1/128'], rpmOverride: 600, adaptive: false, readPaths: { POST: ['/q'] } } });
  const { limit, ...shown } = await svc.admin(['pool', 'show', 'set-cli', '--team', teamSlug]);
  t.same(shown, set, 'show prints what set wrote');
  t.match(limit, { max_concurrent: 20, adaptive: false }, 'and the effective limit (issue 26 item 4)');
  const back = await svc.admin(['pool', 'set', 'set-cli', '--team', teamSlug, '--rpm-override', 'none', '--reset', 'queueTimeoutMs,ip-allowlist']);
  t.equal(back.settings.rpmOverride, null);
  t.equal(back.settings.queueTimeoutMs, DEFAULT_POOL_SETTINGS.queueTimeoutMs);
  t.same(back.settings.ipAllowlist, []);

  const bad = await runAdmin(['pool', 'set', 'set-cli', '--team', teamSlug, '--max-concurrent', '5', '--lease-term-ms', '1000', '--renew-interval-ms', '2000'], deps);
  t.equal(bad.code, 2);
  t.match(bad.stderr, /renewIntervalMs \(2000\) must be less than settings\.leaseTermMs \(1000\)/);
  t.equal((await svc.admin(['pool', 'show', 'set-cli', '--team', teamSlug])).max_concurrent, 20, 'the failed set wrote nothing');
  const missing = await runAdmin(['pool', 'show', 'nope', '--team', teamSlug], deps);
  t.equal(missing.code, 2);
  t.match(missing.stderr, /not found/);
});

t.test('a change reaches the data plane within a second, without a restart', async (t) => {
  await createPool('set-live');
  t.equal((await call('set-live', '/x')).status, 401, 'a key is required at first');
  await svc.api('PATCH', '/api/v1/pools/set-live/settings', { token, body: { require_key: false } });
  const ms = await within(1000, async () => (await call('set-live', '/x')).status === 200);
  t.ok(ms < 1000, `require_key off applied in ${Math.round(ms)} ms`);

  await svc.api('PATCH', '/api/v1/pools/set-live/settings', { token, body: { settings: { ipAllowlist: ['10.0.0.0/8'] } } });
  await within(1000, async () => (await call('set-live', '/x')).status === 403);
  await svc.api('PATCH', '/api/v1/pools/set-live/settings', { token, body: { settings: { ipAllowlist: null, requestTimeoutMs: 300 } } });
  await within(1000, async () => (await call('set-live', '/delay/600')).status === 504);
  t.pass('allowlist and request timeout applied through the proxy');
});

t.test('lowering max_concurrent below the slots in flight lets them finish and admits no more until below the new limit', async (t) => {
  await createPool('set-shrink', 4);
  await svc.api('PATCH', '/api/v1/pools/set-shrink/settings', { token, body: { require_key: false } });
  await within(1000, async () => (await call('set-shrink', '/x')).status === 200);
  origin.reset();
  const slow = [0, 1, 2, 3].map(() => call('set-shrink', '/delay/1200'));
  await within(1000, async () => origin.active === 4);
  const res = await svc.api('PATCH', '/api/v1/pools/set-shrink/settings', { token, body: { max_concurrent: 2 } });
  t.equal(res.status, 200);
  await within(1000, async () => svc.service.dataplane!.governor.state(res.body.data.pool_id).effectiveLimit === 2);
  const refused = await call('set-shrink', '/x', { 'x-service-no-queue': '1' });
  t.equal(refused.status, 429, '4 in flight over a limit of 2: a new request is not admitted');
  const done = await Promise.all(slow);
  t.same(done.map((d) => d.status), [200, 200, 200, 200], 'the requests in flight finished normally');
  t.equal((await call('set-shrink', '/x', { 'x-service-no-queue': '1' })).status, 200, 'admitted again once below the new limit');
  origin.reset();
  const burst = await Promise.all([0, 1, 2, 3, 4, 5].map(() => call('set-shrink', '/delay/200')));
  t.equal(burst.filter((b) => b.status === 200).length, 6, 'queued requests all get through');
  t.ok(origin.peak <= 2, `never more than 2 at the origin after the change (peak ${origin.peak})`);
});

t.test('the other settings the proxy and lock API read take effect through them', async (t) => {
  const moreId = await createPool('set-more', 1);
  const mint = async (access: 'read' | 'write') => {
    const res = await svc.api('POST', '/api/v1/pools/set-more/keys', { token, body: { access } });
    return res.body.data.key as string;
  };
  const writeKey = await mint('write');
  const readKey = await mint('read');
  await svc.service.dataplane!.snapshots.reload();
  const patch = (settings: Record<string, unknown>) => svc.api('PATCH', '/api/v1/pools/set-more/settings', { token, body: { settings } });

  // allowBearerKey
  t.equal((await call('set-more', '/x', { authorization: `Bearer ${writeKey}` })).status, 200, 'Bearer keys are accepted by default');
  await patch({ allowBearerKey: false });
  await within(1000, async () => (await call('set-more', '/x', { authorization: `Bearer ${writeKey}` })).status === 401);
  t.pass('allowBearerKey false: a Bearer key is refused');

  // readMethods / readPaths
  t.equal((await call('set-more', '/search', { 'x-service-key': readKey }, 'POST')).status, 403, 'a read key may not POST by default');
  await patch({ readMethods: ['POST'], readPaths: { POST: ['/search'] } });
  await within(1000, async () => (await call('set-more', '/search', { 'x-service-key': readKey }, 'POST')).status === 200);
  t.equal((await call('set-more', '/other', { 'x-service-key': readKey }, 'POST')).status, 403, 'outside the read path prefix');

  // queueTimeoutMs and queueLength (max_concurrent 1: one slow request holds the slot)
  // The second waiter is sent once the first is in the queue (not after a fixed gap), well inside its 1 s wait.
  await patch({ queueTimeoutMs: 1000, queueLength: 1 });
  await svc.service.dataplane!.snapshots.reload();
  const holder = call('set-more', '/delay/2500', { 'x-service-key': writeKey });
  await within(1000, async () => origin.active >= 1);
  const waiting = call('set-more', '/x', { 'x-service-key': writeKey });
  await within(1000, async () => svc.service.dataplane!.governor.state(moreId).queued === 1);
  const [waited, full] = await Promise.all([waiting, call('set-more', '/x', { 'x-service-key': writeKey })]);
  t.equal(waited.status, 504, 'queueTimeoutMs bounds the wait');
  t.equal(full.status, 429, 'queueLength 1: a second waiter is refused at once');
  t.equal((await holder).status, 200);

  // leaseTermMs / renewIntervalMs reach the lock API's grant
  await patch({ leaseTermMs: 4000, renewIntervalMs: 1500 });
  await svc.service.dataplane!.snapshots.reload();
  const lock = new Pool(`http://127.0.0.1:${svc.service.ports.lock}`);
  t.teardown(() => lock.close());
  const res = await lock.request({ path: '/pools/set-more/lock/acquire', method: 'POST', headers: { 'x-service-key': writeKey } });
  const grant = (await res.body.json()) as { termMs: number; renewIntervalMs: number; slotId: string };
  t.equal(res.statusCode, 200);
  t.match(grant, { termMs: 4000, renewIntervalMs: 1500 });
  const rel = await lock.request({ path: `/pools/set-more/lock/${grant.slotId}/release`, method: 'POST', headers: { 'x-service-key': writeKey } });
  await rel.body.text();
});
