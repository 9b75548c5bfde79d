// Webhook destinations through the Control API and the admin CLI (spec: Webhook destinations, WebhookEndpoint,
// PoolWebhooks, Webhook destination and Pool async mode state tables, Limits, Errors).
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { request } from 'undici';
import { startTestService } from './helpers/service.js';
import { needServer } from './helpers/servers.js';
import { buildControlApp } from '../src/control/app.js';
import { runAdmin } from '../src/admin/commands.js';
import { sha256Hex } from '../src/security/tokens.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import type { Lookup } from '../src/security/targets.js';

const CAP = 3;
// Fixed DNS so the SSRF guard is exercised for real with allowPrivateTargets off.
const ADDRESSES: Record<string, string[]> = {
  'hooks.example.test': ['93.184.216.34'],
  'other.example.test': ['93.184.216.35'],
  'intranet.example.test': ['10.1.2.3'],
  'mixed.example.test': ['93.184.216.34', '192.168.1.10'],
};
const lookup: Lookup = async (host) => {
  const a = ADDRESSES[host];
  if (!a) throw new Error(`ENOTFOUND ${host}`);
  return a;
};
const HOOK_URL = 'https://hooks.example.test/poolgate';

const svc = await startTestService({ overrides: { allowPrivateTargets: false, maxWebhookDestinations: CAP }, lookup });
t.teardown(() => svc.close());
const sql = svc.service.sql;

interface TeamFixture { token: string; slug: string; id: number }

async function newTeam(plan = 'team'): Promise<TeamFixture> {
  const boot = await svc.bootstrap({ plan });
  return { token: boot.token, slug: boot.team.slug, id: boot.team.id };
}

async function newPool(teamId: number, asyncEnabled = false): Promise<{ id: number; subdomain: string }> {
  const subdomain = `p-${randomBytes(4).toString('hex')}`;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, async_enabled)
     VALUES ($1, $2, $2, 'http', 'https://api.example.test', 'api.example.test', $3) RETURNING id`,
    [teamId, subdomain, asyncEnabled],
  );
  return { id: rows[0]!.id, subdomain };
}

/** A member's API token, inserted directly: `token create` refuses members, as the spec demands. */
async function memberToken(team: TeamFixture): Promise<string> {
  const email = `m-${randomBytes(3).toString('hex')}@x.test`;
  const added = await svc.admin(['user', 'add', '--team', team.slug, '--email', email, '--role', 'member']);
  const token = `pgt_member${randomBytes(16).toString('hex')}`;
  await sql.query(
    `INSERT INTO api_tokens (team_id, user_id, name, token_hash, last_four, abilities, expires_at)
     VALUES ($1, $2, 'member', $3, $4, $5, now() + interval '1 day')`,
    [team.id, added.user.id, sha256Hex(token), token.slice(-4), ['budgets:read', 'pools:read', 'pools:write', 'keys:write', 'metrics:read']],
  );
  return token;
}

const createHook = (token: string, body: unknown) => svc.api('POST', '/api/v1/webhooks', { token, body });

async function countRows(table: string, teamId: number): Promise<number> {
  const { rows } = await sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table} WHERE team_id = $1`, [teamId]);
  return rows[0]!.n;
}

async function storedSecret(id: number): Promise<string> {
  const { rows } = await sql.query<{ signing_secret_enc: string }>('SELECT signing_secret_enc FROM webhook_endpoints WHERE id = $1', [id]);
  return rows[0]!.signing_secret_enc;
}

async function attachments(poolId: number): Promise<number[]> {
  const { rows } = await sql.query<{ id: number }>('SELECT webhook_endpoint_id AS id FROM pool_webhooks WHERE pool_id = $1 ORDER BY 1', [poolId]);
  return rows.map((r) => r.id);
}

async function asyncEnabled(poolId: number): Promise<boolean> {
  const { rows } = await sql.query<{ async_enabled: boolean }>('SELECT async_enabled FROM pools WHERE id = $1', [poolId]);
  return rows[0]!.async_enabled;
}

t.test('create: 201 with the signing secret once, pools attached and switched to async', async (t) => {
  const team = await newTeam();
  const off = await newPool(team.id, false);
  const on = await newPool(team.id, true);
  const res = await createHook(team.token, { name: 'Orders', url: HOOK_URL, description: 'order jobs', pool_ids: [off.id, on.id, off.id] });
  t.equal(res.status, 201, JSON.stringify(res.body));
  const hook = res.body.data;
  t.match(hook.signing_secret, /^whsec_[A-Za-z0-9]{40}$/);
  t.same(
    { ...hook, signing_secret: undefined, id: undefined },
    { name: 'Orders', description: 'order jobs', url: HOOK_URL, disabled: false, pool_ids: [off.id, on.id].sort((a, b) => a - b), async_enabled_on_pool_ids: [off.id], signing_secret: undefined, id: undefined },
  );
  t.equal(await asyncEnabled(off.id), true, 'the pool that was off is now async');
  t.equal(await asyncEnabled(on.id), true);

  const enc = await storedSecret(hook.id);
  t.notOk(enc.includes(hook.signing_secret) || enc.includes(hook.signing_secret.slice(6)), 'no plaintext secret in the row');
  t.equal(svc.service.box.open(enc), hook.signing_secret, 'the row holds the secret sealed with the master key');

  const list = await svc.api('GET', '/api/v1/webhooks', { token: team.token });
  t.equal(list.status, 200);
  t.same(list.body, { data: [{ id: hook.id, name: 'Orders', description: 'order jobs', url: HOOK_URL, disabled: false, pool_ids: hook.pool_ids }] });
  t.notOk('signing_secret' in list.body.data[0], 'the list never shows the secret');
});

t.test('create with new_credential stores a sealed bearer_static credential and uses it; credential_id attaches an existing one', async (t) => {
  const team = await newTeam();
  const res = await createHook(team.token, {
    name: 'With auth',
    url: HOOK_URL,
    auth_header: 'x-hook-token',
    new_credential: { name: 'hook bearer', bearer_token: 'secret-bearer-123' },
  });
  t.equal(res.status, 201, JSON.stringify(res.body));
  const { rows } = await sql.query<{ credential_id: number; auth_header: string; method: string; cname: string; secret_enc: string }>(
    `SELECT w.credential_id, w.auth_header, c.method, c.name AS cname, c.secret_enc
       FROM webhook_endpoints w JOIN credentials c ON c.id = w.credential_id WHERE w.id = $1`,
    [res.body.data.id],
  );
  t.equal(rows[0]!.method, 'bearer_static');
  t.equal(rows[0]!.cname, 'hook bearer');
  t.equal(rows[0]!.auth_header, 'x-hook-token');
  t.notOk(rows[0]!.secret_enc.includes('secret-bearer-123'));

  const again = await createHook(team.token, { name: 'Reuses auth', url: HOOK_URL, credential_id: rows[0]!.credential_id });
  t.equal(again.status, 201, JSON.stringify(again.body));
  const { rows: r2 } = await sql.query<{ credential_id: number; auth_header: string | null }>(
    'SELECT credential_id, auth_header FROM webhook_endpoints WHERE id = $1',
    [again.body.data.id],
  );
  t.same(r2[0], { credential_id: rows[0]!.credential_id, auth_header: null }, 'no auth_header means the Authorization header');
});

t.test('create refuses invalid input with 422 and changes nothing', async (t) => {
  const team = await newTeam();
  const other = await newTeam();
  const otherPool = await newPool(other.id);
  const { rows: apiKey } = await sql.query<{ id: number }>(
    `INSERT INTO credentials (team_id, name, method, secret_enc) VALUES ($1, 'origin key', 'api_key', 'v1:x:y:z') RETURNING id`,
    [team.id],
  );
  const { rows: otherBearer } = await sql.query<{ id: number }>(
    `INSERT INTO credentials (team_id, name, method, secret_enc) VALUES ($1, 'their bearer', 'bearer_static', 'v1:x:y:z') RETURNING id`,
    [other.id],
  );
  t.equal((await createHook(team.token, { name: 'Taken', url: HOOK_URL })).status, 201);
  const before = { hooks: await countRows('webhook_endpoints', team.id), creds: await countRows('credentials', team.id) };

  const cases: Array<[string, Record<string, unknown>, RegExp]> = [
    ['name missing', { url: HOOK_URL }, /name/],
    ['url missing', { name: 'a' }, /url/],
    ['name too long', { name: 'n'.repeat(61), url: HOOK_URL }, /name/],
    ['name blank', { name: '   ', url: HOOK_URL }, /blank/],
    ['name taken', { name: 'Taken', url: HOOK_URL }, /taken/],
    ['url too long', { name: 'a', url: `${HOOK_URL}/${'x'.repeat(500)}` }, /url/],
    ['url not a URL', { name: 'a', url: 'hooks.example.test/x' }, /valid/],
    ['url http', { name: 'a', url: 'http://hooks.example.test/x' }, /https/],
    ['url with userinfo', { name: 'a', url: 'https://u:p@hooks.example.test/x' }, /user/],
    ['url with fragment', { name: 'a', url: `${HOOK_URL}#frag` }, /fragment/],
    ['loopback host', { name: 'a', url: 'https://127.0.0.1/x' }, /refused/],
    ['localhost', { name: 'a', url: 'https://localhost:8443/x' }, /refused/],
    ['ipv6 loopback', { name: 'a', url: 'https://[::1]/x' }, /refused/],
    ['private address', { name: 'a', url: 'https://10.0.0.8/x' }, /refused/],
    ['name resolving to a private address', { name: 'a', url: 'https://intranet.example.test/x' }, /refused/],
    ['one private address among public ones', { name: 'a', url: 'https://mixed.example.test/x' }, /refused/],
    ['link-local (metadata) address', { name: 'a', url: 'https://169.254.169.254/latest' }, /refused/],
    ['the service\'s own pool domain', { name: 'a', url: 'https://orders.pools.localhost/x' }, /this service/],
    ['unresolvable host', { name: 'a', url: 'https://nowhere.example.test/x' }, /resolve/],
    ['description too long', { name: 'a', url: HOOK_URL, description: 'd'.repeat(201) }, /description/],
    ['unknown property', { name: 'a', url: HOOK_URL, secret: 'x' }, /unknown property "secret"/],
    ['unknown nested property', { name: 'a', url: HOOK_URL, new_credential: { name: 'c', bearer_token: 't', extra: 1 } }, /new_credential/],
    ['pool_ids not integers', { name: 'a', url: HOOK_URL, pool_ids: ['1'] }, /pool_ids/],
    ['unknown pool', { name: 'a', url: HOOK_URL, pool_ids: [999999] }, /pool 999999 not found/],
    ['another team\'s pool', { name: 'a', url: HOOK_URL, pool_ids: [otherPool.id] }, /not found/],
    ['unknown credential', { name: 'a', url: HOOK_URL, credential_id: 999999 }, /credential/],
    ['another team\'s credential', { name: 'a', url: HOOK_URL, credential_id: otherBearer[0]!.id }, /not found/],
    ['credential of the wrong method', { name: 'a', url: HOOK_URL, credential_id: apiKey[0]!.id }, /bearer_static/],
    ['credential_id and new_credential', { name: 'a', url: HOOK_URL, credential_id: apiKey[0]!.id, new_credential: { name: 'c', bearer_token: 't' } }, /not both/],
    ['new_credential name too long', { name: 'a', url: HOOK_URL, new_credential: { name: 'c'.repeat(61), bearer_token: 't' } }, /new_credential/],
    ['new_credential token too long', { name: 'a', url: HOOK_URL, new_credential: { name: 'c', bearer_token: 't'.repeat(4001) } }, /new_credential/],
    ['new_credential name taken', { name: 'a', url: HOOK_URL, new_credential: { name: 'origin key', bearer_token: 't' } }, /taken/],
    ['auth_header without a credential', { name: 'a', url: HOOK_URL, auth_header: 'x-token' }, /auth_header/],
    ['auth_header upper case', { name: 'a', url: HOOK_URL, auth_header: 'X-Token', new_credential: { name: 'c', bearer_token: 't' } }, /lower-case/],
    ['auth_header too long', { name: 'a', url: HOOK_URL, auth_header: 'x'.repeat(65), new_credential: { name: 'c', bearer_token: 't' } }, /auth_header/],
    ['auth_header reserved', { name: 'a', url: HOOK_URL, auth_header: 'x-service-signature', new_credential: { name: 'c', bearer_token: 't' } }, /reserved/],
  ];
  for (const [label, body, message] of cases) {
    const res = await createHook(team.token, body);
    t.equal(res.status, 422, `${label}: ${JSON.stringify(res.body)}`);
    t.match(res.body?.message, message, label);
  }
  t.same({ hooks: await countRows('webhook_endpoints', team.id), creds: await countRows('credentials', team.id) }, before, 'nothing was written');
});

t.test('plan gate: a free or pro organization cannot create or attach destinations; detaching is allowed', async (t) => {
  for (const plan of ['free', 'pro']) {
    const team = await newTeam(plan);
    const pool = await newPool(team.id);
    const res = await createHook(team.token, { name: 'x', url: HOOK_URL, pool_ids: [pool.id] });
    t.equal(res.status, 422, plan);
    t.match(res.body.message, /Team or Business plan/);
    t.equal(await countRows('webhook_endpoints', team.id), 0);
    t.equal(await asyncEnabled(pool.id), false, 'async stays off');

    // A destination left over from before a downgrade.
    const { rows } = await sql.query<{ id: number }>(
      `INSERT INTO webhook_endpoints (team_id, name, url, signing_secret_enc) VALUES ($1, 'old', $2, 'v1:a:b:c') RETURNING id`,
      [team.id, HOOK_URL],
    );
    const attach = await svc.api('PUT', `/api/v1/pools/${pool.subdomain}/webhooks`, { token: team.token, body: { webhook_endpoint_ids: [rows[0]!.id] } });
    t.equal(attach.status, 422);
    t.match(attach.body.message, /Team or Business plan/);
    const detach = await svc.api('PUT', `/api/v1/pools/${pool.subdomain}/webhooks`, { token: team.token, body: { webhook_endpoint_ids: [] } });
    t.equal(detach.status, 200, 'detaching all is allowed on any plan');
  }
  const business = await newTeam('business');
  t.equal((await createHook(business.token, { name: 'x', url: HOOK_URL })).status, 201, 'business plan may');
});

t.test('cap: at most maxWebhookDestinations per organization', async (t) => {
  const team = await newTeam();
  for (let i = 0; i < CAP; i++) t.equal((await createHook(team.token, { name: `hook ${i}`, url: HOOK_URL })).status, 201);
  const res = await createHook(team.token, { name: 'one too many', url: HOOK_URL });
  t.equal(res.status, 422);
  t.match(res.body.message, /cap reached.*at most 3/);
  t.equal(await countRows('webhook_endpoints', team.id), CAP);
  const other = await newTeam();
  t.equal((await createHook(other.token, { name: 'hook 0', url: HOOK_URL })).status, 201, 'the cap and names are per organization');
});

t.test('rotate: a new secret once, the stored secret changes, the change is projected; 404 outside the organization', async (t) => {
  const team = await newTeam();
  const pool = await newPool(team.id);
  const created = (await createHook(team.token, { name: 'r', url: HOOK_URL, pool_ids: [pool.id] })).body.data;
  const changes: string[] = [];
  const unlisten = await sql.listen(CHANGE_CHANNEL, (p) => changes.push(p));
  t.teardown(unlisten);

  const res = await svc.api('POST', `/api/v1/webhooks/${created.id}/rotate`, { token: team.token });
  t.equal(res.status, 200, JSON.stringify(res.body));
  const rotated = res.body.data;
  t.match(rotated.signing_secret, /^whsec_/);
  t.not(rotated.signing_secret, created.signing_secret);
  t.same({ ...rotated, signing_secret: undefined }, { id: created.id, name: 'r', description: null, url: HOOK_URL, disabled: false, pool_ids: [pool.id], signing_secret: undefined });
  t.equal(svc.service.box.open(await storedSecret(created.id)), rotated.signing_secret, 'the stored secret is the new one');
  for (let i = 0; i < 50 && !changes.includes(`webhook:${created.id}`); i++) await new Promise((r) => setTimeout(r, 20));
  t.ok(changes.includes(`webhook:${created.id}`), 'the data plane is told');

  const other = await newTeam();
  const theirs = (await createHook(other.token, { name: 'theirs', url: HOOK_URL })).body.data;
  const before = await storedSecret(theirs.id);
  const cross = await svc.api('POST', `/api/v1/webhooks/${theirs.id}/rotate`, { token: team.token });
  t.equal(cross.status, 404);
  t.same(cross.body, { message: 'webhook destination not found' });
  t.equal(await storedSecret(theirs.id), before);
  t.equal((await svc.api('POST', '/api/v1/webhooks/999999/rotate', { token: team.token })).status, 404);
  t.equal((await svc.api('POST', '/api/v1/webhooks/abc/rotate', { token: team.token })).status, 404);
});

t.test('rotate: 503 when the edge projection fails, and the signing key is unchanged', async (t) => {
  const team = await newTeam();
  const pool = await newPool(team.id);
  const created = (await createHook(team.token, { name: 'p', url: HOOK_URL, pool_ids: [pool.id] })).body.data;
  const before = await storedSecret(created.id);

  // A second Control API on the same store whose projection to the data plane fails.
  const app = await buildControlApp({
    config: svc.config,
    sql,
    box: svc.service.box,
    now: () => new Date(),
    log: svc.service.log,
    urls: { base: svc.controlUrl, lockApi: svc.controlUrl, dashboard: svc.controlUrl },
    targets: { allowPrivate: false, ownHosts: [svc.config.poolDomain], lookup },
    project: async () => {
      throw new Error('edge unreachable');
    },
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  t.teardown(() => app.close());
  const addr = app.server.address() as { port: number };
  const call = async (method: 'POST' | 'PUT', path: string, body?: unknown) => {
    const res = await request(`http://127.0.0.1:${addr.port}${path}`, {
      method,
      headers: { authorization: `Bearer ${team.token}`, 'content-type': 'application/json', accept: 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: res.statusCode, body: (await res.body.json()) as { message: string } };
  };

  const res = await call('POST', `/api/v1/webhooks/${created.id}/rotate`);
  t.equal(res.status, 503);
  t.same(res.body, { message: 'edge projection failed, signing key unchanged' });
  t.equal(await storedSecret(created.id), before, 'the old key is still stored');
  t.equal(svc.service.box.open(await storedSecret(created.id)), created.signing_secret);

  // The same rule holds for the other writes: a failed projection writes nothing.
  const create = await call('POST', '/api/v1/webhooks', { name: 'not created', url: HOOK_URL });
  t.equal(create.status, 503);
  t.equal(await countRows('webhook_endpoints', team.id), 1);
  const attach = await call('PUT', `/api/v1/pools/${pool.subdomain}/webhooks`, { webhook_endpoint_ids: [] });
  t.equal(attach.status, 503);
  t.same(await attachments(pool.id), [created.id], 'attachments unchanged');
});

t.test('PUT /pools/{pool}/webhooks replaces the attachments, turns async on, and an empty list detaches all', async (t) => {
  const team = await newTeam();
  const pool = await newPool(team.id);
  const a = (await createHook(team.token, { name: 'a', url: HOOK_URL })).body.data;
  const b = (await createHook(team.token, { name: 'b', url: 'https://other.example.test/hook' })).body.data;
  const put = (subdomain: string, body: unknown, token = team.token) => svc.api('PUT', `/api/v1/pools/${subdomain}/webhooks`, { token, body });

  let res = await put(pool.subdomain, { webhook_endpoint_ids: [b.id, a.id] });
  t.equal(res.status, 200, JSON.stringify(res.body));
  t.same(res.body, { data: { pool_id: pool.id, subdomain: pool.subdomain, webhook_endpoint_ids: [a.id, b.id].sort((x, y) => x - y), async_enabled: true, async_on_queue: false } });

  res = await put(pool.subdomain, { webhook_endpoint_ids: [b.id] });
  t.same(res.body.data.webhook_endpoint_ids, [b.id], 'replaced, not merged');
  const list = await svc.api('GET', '/api/v1/webhooks', { token: team.token });
  t.same(list.body.data.map((w: { id: number; pool_ids: number[] }) => [w.id, w.pool_ids]), [[a.id, []], [b.id, [pool.id]]]);

  res = await put(pool.subdomain, { webhook_endpoint_ids: [] });
  t.equal(res.status, 200);
  t.same(res.body.data.webhook_endpoint_ids, []);
  t.equal(res.body.data.async_enabled, true, 'detaching leaves async_enabled as it was');
  t.same(await attachments(pool.id), []);

  // 4xx: unknown or another team's destination, pool not found, bad body. Each changes nothing.
  await put(pool.subdomain, { webhook_endpoint_ids: [a.id] });
  const other = await newTeam();
  const theirs = (await createHook(other.token, { name: 'theirs', url: HOOK_URL })).body.data;
  const theirPool = await newPool(other.id);
  for (const [label, subdomain, body, status] of [
    ['unknown destination', pool.subdomain, { webhook_endpoint_ids: [a.id, 999999] }, 422],
    ['another team\'s destination', pool.subdomain, { webhook_endpoint_ids: [theirs.id] }, 422],
    ['ids missing', pool.subdomain, {}, 422],
    ['ids not integers', pool.subdomain, { webhook_endpoint_ids: 'all' }, 422],
    ['unknown property', pool.subdomain, { webhook_endpoint_ids: [], async: true }, 422],
    ['unknown pool', 'no-such-pool', { webhook_endpoint_ids: [] }, 404],
    ['another team\'s pool', theirPool.subdomain, { webhook_endpoint_ids: [] }, 404],
  ] as const) {
    const r = await put(subdomain, body);
    t.equal(r.status, status, `${label}: ${JSON.stringify(r.body)}`);
    t.type(r.body.message, 'string');
  }
  t.same(await attachments(pool.id), [a.id], 'attachments unchanged by the refused requests');
  t.equal(await asyncEnabled(theirPool.id), false);
});

t.test('only owners and admins manage webhooks; members and tokens without pools:write get 403', async (t) => {
  const team = await newTeam();
  const pool = await newPool(team.id);
  const hook = (await createHook(team.token, { name: 'h', url: HOOK_URL })).body.data;
  const member = await memberToken(team);
  const before = await storedSecret(hook.id);

  const create = await createHook(member, { name: 'by member', url: HOOK_URL });
  t.equal(create.status, 403);
  t.same(create.body, { message: 'only owners and admins may manage webhooks' });
  t.equal((await svc.api('POST', `/api/v1/webhooks/${hook.id}/rotate`, { token: member })).status, 403);
  t.equal((await svc.api('PUT', `/api/v1/pools/${pool.subdomain}/webhooks`, { token: member, body: { webhook_endpoint_ids: [hook.id] } })).status, 403);
  t.equal((await svc.api('GET', '/api/v1/webhooks', { token: member })).status, 200, 'members may list');
  t.equal(await storedSecret(hook.id), before);
  t.same(await attachments(pool.id), []);

  const admin = await svc.admin(['user', 'add', '--team', team.slug, '--email', 'a@x.test', '--role', 'admin']);
  const adminTok = await svc.admin(['token', 'create', '--team', team.slug, '--user', String(admin.user.id)]);
  t.equal((await createHook(adminTok.token, { name: 'by admin', url: HOOK_URL })).status, 201, 'admins may');

  const readOnly = await svc.admin(['token', 'create', '--team', team.slug, '--user', String(admin.user.id), '--abilities', 'pools:read']);
  const denied = await createHook(readOnly.token, { name: 'ro', url: HOOK_URL });
  t.equal(denied.status, 403);
  t.match(denied.body.message, /pools:write/);
  t.equal((await svc.api('GET', '/api/v1/webhooks', { token: readOnly.token })).status, 200);
  const noRead = await svc.admin(['token', 'create', '--team', team.slug, '--user', String(admin.user.id), '--abilities', 'metrics:read']);
  t.equal((await svc.api('GET', '/api/v1/webhooks', { token: noRead.token })).status, 403);
  t.equal((await svc.api('GET', '/api/v1/webhooks')).status, 401);
});

t.test('admin webhook enable re-enables a deactivated destination and resets its failure streak', async (t) => {
  const team = await newTeam();
  const hook = (await createHook(team.token, { name: 'flaky', url: HOOK_URL })).body.data;
  await sql.query('UPDATE webhook_endpoints SET disabled = true, consecutive_failures = 8 WHERE id = $1', [hook.id]);
  t.equal((await svc.api('GET', '/api/v1/webhooks', { token: team.token })).body.data[0].disabled, true);

  const out = await svc.admin(['webhook', 'enable', '--team', team.slug, '--id', String(hook.id)]);
  t.match(out, { webhook: { id: hook.id, disabled: false, consecutive_failures: 0 }, was_disabled: true });
  const { rows } = await sql.query('SELECT disabled, consecutive_failures FROM webhook_endpoints WHERE id = $1', [hook.id]);
  t.same(rows[0], { disabled: false, consecutive_failures: 0 });
  t.equal((await svc.api('GET', '/api/v1/webhooks', { token: team.token })).body.data[0].disabled, false);

  const deps = { config: svc.config, sql, box: svc.service.box, now: () => new Date() };
  const other = await newTeam();
  const cross = await runAdmin(['webhook', 'enable', '--team', other.slug, '--id', String(hook.id)], deps);
  t.equal(cross.code, 2, 'another team\'s destination is not found');
  t.match(cross.stderr, /not found/);
  const help = await runAdmin(['webhook', 'enable', '--help'], deps);
  t.equal(help.code, 0);
  t.match(help.stdout, /webhook enable --team TEAM --id WEBHOOK_ID/);
});

t.test('admin webhook history lists delivery attempts newest first', async (t) => {
  const team = await newTeam();
  const pool = await newPool(team.id);
  const hook = (await createHook(team.token, { name: 'h', url: HOOK_URL, pool_ids: [pool.id] })).body.data;
  await sql.query(
    `INSERT INTO webhook_delivery_attempts (webhook_endpoint_id, job_id, pool_id, attempted_at, result, http_status, error, attempt, latency_ms)
     VALUES ($1, 'job_1', $2, '2030-01-01T00:00:00Z', 'failure', NULL, 'connect ECONNREFUSED', 1, 12),
            ($1, 'job_1', $2, '2030-01-01T00:00:10Z', 'failure', 502, NULL, 2, 80),
            ($1, 'job_1', $2, '2030-01-01T00:00:40Z', 'success', 200, NULL, 3, 45)`,
    [hook.id, pool.id],
  );
  const out = await svc.admin(['webhook', 'history', '--team', team.slug, '--id', String(hook.id)]);
  t.same(out.attempts, [
    { time: '2030-01-01T00:00:40.000Z', job_id: 'job_1', pool_id: pool.id, pool: pool.subdomain, result: 'success', http_status: 200, error: null, attempt: 3, latency_ms: 45 },
    { time: '2030-01-01T00:00:10.000Z', job_id: 'job_1', pool_id: pool.id, pool: pool.subdomain, result: 'failure', http_status: 502, error: null, attempt: 2, latency_ms: 80 },
    { time: '2030-01-01T00:00:00.000Z', job_id: 'job_1', pool_id: pool.id, pool: pool.subdomain, result: 'failure', http_status: null, error: 'connect ECONNREFUSED', attempt: 1, latency_ms: 12 },
  ]);
  const limited = await svc.admin(['webhook', 'history', '--team', team.slug, '--id', String(hook.id), '--limit', '1']);
  t.same(limited.attempts.map((a: { attempt: number }) => a.attempt), [3]);

  const deps = { config: svc.config, sql, box: svc.service.box, now: () => new Date() };
  t.equal((await runAdmin(['webhook', 'history', '--team', team.slug, '--id', String(hook.id), '--limit', '0'], deps)).code, 2);
  t.equal((await runAdmin(['webhook', 'history', '--team', team.slug], deps)).code, 2, '--id is required');
  t.match((await runAdmin(['webhook', 'history', '--help'], deps)).stdout, /--limit N/);
});

t.test('on PostgreSQL, concurrent creates never pass the cap and a raced name is 422, not 500', { skip: await needServer('postgres') }, async (t) => {
  const pgSvc = await startTestService({ engine: 'postgres', overrides: { allowPrivateTargets: false, maxWebhookDestinations: CAP }, lookup });
  t.teardown(() => pgSvc.close());
  const boot = await pgSvc.bootstrap({ plan: 'team' });
  const burst = await Promise.all(
    Array.from({ length: 10 }, (_, i) => pgSvc.api('POST', '/api/v1/webhooks', { token: boot.token, body: { name: `hook ${i}`, url: HOOK_URL } })),
  );
  t.same(burst.map((r) => r.status).sort(), [201, 201, 201, 422, 422, 422, 422, 422, 422, 422]);
  const { rows } = await pgSvc.service.sql.query<{ n: number }>('SELECT count(*)::int AS n FROM webhook_endpoints WHERE team_id = $1', [boot.team.id]);
  t.equal(rows[0]!.n, CAP);

  const other = await pgSvc.bootstrap({ plan: 'business' });
  const same = await Promise.all(
    Array.from({ length: 5 }, () => pgSvc.api('POST', '/api/v1/webhooks', { token: other.token, body: { name: 'same', url: HOOK_URL } })),
  );
  t.same(same.map((r) => r.status).sort(), [201, 422, 422, 422, 422]);
});
