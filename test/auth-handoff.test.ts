import t from 'tap';
import { until } from './helpers/until.js';
import { startTestApi, type TestApi } from './helpers/service.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';

let svc: TestApi;
let owner: Awaited<ReturnType<TestApi['bootstrap']>>;
let other: Awaited<ReturnType<TestApi['bootstrap']>>;

t.before(async () => {
  svc = await startTestApi();
  owner = await svc.bootstrap({ team: 'Handoff Team' });
  other = await svc.bootstrap({ team: 'Handoff Other' });
});
t.teardown(() => svc?.close());

let n = 0;
async function httpPool(token = owner.token) {
  const res = await svc.api('POST', '/api/v1/pools', { token, body: { origin: `https://h${++n}.example.com` } });
  if (res.status !== 201) throw new Error(`pool create failed: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body.data as { id: number; subdomain: string };
}
async function dbPool() {
  const res = await svc.api('POST', '/api/v1/pools/database', { token: owner.token, body: { db_host: `db${++n}.example.com`, db_name: 'app' } });
  if (res.status !== 201) throw new Error(`db pool create failed: ${res.status}`);
  return res.body.data as { id: number; subdomain: string };
}
const handoff = (subdomain: string, body: unknown, token = owner.token) =>
  svc.api('POST', `/api/v1/pools/${subdomain}/auth-handoff`, { token, body });
const intakePath = (url: string) => new URL(url).pathname;
const poolRow = async (id: number) =>
  (await svc.sql.query<{ managed_auth: boolean; auth_method: string | null; credential_id: number | null }>(
    'SELECT managed_auth, auth_method, credential_id FROM pools WHERE id = $1', [id],
  )).rows[0]!;

t.test('auth-handoff flips the pool to managed auth and mints a one-shot intake (AuthHandoff, unwrapped)', async (t) => {
  const pool = await httpPool();
  const seen: string[] = [];
  const unlisten = await svc.sql.listen(CHANGE_CHANNEL, (p) => seen.push(p));
  t.teardown(unlisten);

  const res = await handoff(pool.subdomain, { auth_method: 'bearer_static' });
  t.equal(res.status, 200);
  const h = res.body;
  t.notOk('data' in h, 'unwrapped');
  t.match(h, {
    pool: { id: pool.id, subdomain: pool.subdomain, has_credential: false, backend: 'http' },
    custody_flipped: true,
    already_attached: false,
    auth_method: 'bearer_static',
    intake_token: /^pgi_[A-Za-z0-9]{40}$/,
    dashboard_url: `${svc.baseUrl}/dashboard/pools/${pool.subdomain}`,
    required_fields: ['token'],
    auth_posture: 'managed_pending_credential',
    next: /intake_url/,
  });
  t.equal(h.intake_url, `${svc.baseUrl}/api/v1/intake/${h.intake_token}`);
  const ttl = Date.parse(h.expires_at) - Date.now();
  t.ok(ttl > 890_000 && ttl <= 900_000, `expires after intakeTtlSeconds (${ttl} ms)`);
  t.same(await poolRow(pool.id), { managed_auth: true, auth_method: 'bearer_static', credential_id: null });
  const stored = await svc.sql.query<{ token_hash: string }>('SELECT token_hash FROM credential_intakes WHERE pool_id = $1', [pool.id]);
  t.equal(stored.rows.length, 1);
  t.not(stored.rows[0]!.token_hash, h.intake_token, 'only the hash of the intake token is stored');
  t.match(stored.rows[0]!.token_hash, /^[0-9a-f]{64}$/);

  // A second handoff: custody already managed; the first link is superseded by the new one.
  const again = await handoff(pool.subdomain, { auth_method: 'bearer_static' });
  t.equal(again.status, 200);
  t.equal(again.body.custody_flipped, false);
  t.not(again.body.intake_token, h.intake_token);
  const stale = await svc.api('POST', intakePath(h.intake_url), { body: { token: 'secret' } });
  t.equal(stale.status, 410);

  await until('the handoff announced on the change feed', () => seen.includes(`pool:${pool.id}`));
  t.pass('the handoff is announced on the change feed');
});

t.test('the intake is one-shot, needs no API token, seals the secret and attaches it', async (t) => {
  const pool = await httpPool();
  const h = (await handoff(pool.subdomain, { auth_method: 'basic', credential_name: 'Origin login' })).body;
  t.same(h.required_fields, ['username', 'password']);
  const path = intakePath(h.intake_url);

  // Validation failures leave the intake usable.
  for (const body of [{}, { username: 'svc' }, { token: 'x' }, { username: 'svc', password: 'pw', extra: 1 }, { username: 'a:b', password: 'pw' }, { username: 'svc', password: 'line\nbreak' }]) {
    const res = await svc.api('POST', path, { body });
    t.equal(res.status, 422, JSON.stringify(body));
  }
  t.equal((await svc.api('POST', path)).status, 422, 'no body');

  const plaintext = 'correct horse battery staple';
  const ok = await svc.api('POST', path, { body: { username: 'svc-user', password: plaintext } });
  t.equal(ok.status, 200);
  t.match(ok.body.data, { id: pool.id, has_credential: true });

  const spent = await svc.api('POST', path, { body: { username: 'svc-user', password: 'another' } });
  t.equal(spent.status, 410);
  t.match(spent.body.message, /already used/);

  const row = await poolRow(pool.id);
  t.equal(row.auth_method, 'basic');
  const cred = (await svc.sql.query<{ name: string; method: string; secret_enc: string }>(
    'SELECT name, method, secret_enc FROM credentials WHERE id = $1', [row.credential_id!],
  )).rows[0]!;
  t.equal(cred.name, 'Origin login');
  t.equal(cred.method, 'basic');
  t.notOk(cred.secret_enc.includes(plaintext), 'the stored secret is not the plaintext');
  t.notOk(cred.secret_enc.includes('svc-user'));
  t.same(JSON.parse(svc.box.open(cred.secret_enc)), { method: 'basic', username: 'svc-user', password: plaintext });

  t.equal((await svc.api('POST', `/api/v1/intake/pgi_${'A'.repeat(40)}`, { body: { token: 'x' } })).status, 404, 'unknown token');
  t.equal((await svc.api('POST', '/api/v1/intake/not-a-token', { body: { token: 'x' } })).status, 404, 'malformed token');

  const after = await handoff(pool.subdomain, { auth_method: 'basic' });
  t.equal(after.body.auth_posture, 'managed', 'a pool with its credential attached is managed');
});

t.test('concurrent posts of one intake: exactly one succeeds', async (t) => {
  const pool = await httpPool();
  const h = (await handoff(pool.subdomain, { auth_method: 'api_key' })).body;
  const path = intakePath(h.intake_url);
  const results = await Promise.all(Array.from({ length: 6 }, (_, i) => svc.api('POST', path, { body: { api_key: `k${i}`, header_name: 'X-Api-Token' } })));
  t.same(results.map((r) => r.status).sort(), [200, 410, 410, 410, 410, 410]);
  const { rows } = await svc.sql.query<{ secret_enc: string }>(
    'SELECT c.secret_enc FROM credentials c JOIN pools p ON p.credential_id = c.id WHERE p.id = $1', [pool.id],
  );
  t.match(JSON.parse(svc.box.open(rows[0]!.secret_enc)), { method: 'api_key', header_name: 'x-api-token' });
});

t.test('an expired intake is 410 and creates nothing', async (t) => {
  const pool = await httpPool();
  const h = (await handoff(pool.subdomain, { auth_method: 'bearer_static' })).body;
  await svc.sql.query(`UPDATE credential_intakes SET expires_at = now() - interval '1 second' WHERE pool_id = $1`, [pool.id]);
  const res = await svc.api('POST', intakePath(h.intake_url), { body: { token: 'tok' } });
  t.equal(res.status, 410);
  t.match(res.body.message, /expired/);
  t.equal((await poolRow(pool.id)).credential_id, null);
});

t.test('handoff with an existing credential attaches it at once (already_attached, no intake)', async (t) => {
  const a = await httpPool();
  const put = await svc.api('PUT', `/api/v1/pools/${a.subdomain}/credential`, { token: owner.token, body: { method: 'bearer_static', name: 'Shared bearer', token: 'tok-123' } });
  t.equal(put.status, 200);
  const credId = (await poolRow(a.id)).credential_id!;

  const b = await httpPool();
  const byId = await handoff(b.subdomain, { auth_method: 'bearer_static', credential_id: credId });
  t.equal(byId.status, 200);
  t.match(byId.body, { already_attached: true, custody_flipped: true, intake_url: null, intake_token: null, expires_at: null, auth_posture: 'managed', pool: { has_credential: true } });
  t.equal((await poolRow(b.id)).credential_id, credId);

  const c = await httpPool();
  const byName = await handoff(c.subdomain, { auth_method: 'bearer_static', credential_name: 'Shared bearer', credential_id: null });
  t.match(byName.body, { already_attached: true, pool: { has_credential: true } });

  // Method mismatch, unknown ids, another team's credential, both references: 422, nothing changes.
  const d = await httpPool();
  const theirPool = await httpPool(other.token);
  await svc.api('PUT', `/api/v1/pools/${theirPool.subdomain}/credential`, { token: other.token, body: { method: 'bearer_static', token: 'theirs' } });
  const theirCred = (await poolRow(theirPool.id)).credential_id!;
  for (const body of [
    { auth_method: 'api_key', credential_id: credId },
    { auth_method: 'api_key', credential_name: 'Shared bearer' },
    { auth_method: 'bearer_static', credential_id: 999999 },
    { auth_method: 'bearer_static', credential_id: theirCred },
    { auth_method: 'bearer_static', credential_id: credId, credential_name: 'Shared bearer' },
  ]) {
    const res = await handoff(d.subdomain, body);
    t.equal(res.status, 422, JSON.stringify(body));
  }
  t.same(await poolRow(d.id), { managed_auth: false, auth_method: null, credential_id: null }, 'refused handoffs change nothing');
});

t.test('auth methods must fit the backend; bad bodies are 422', async (t) => {
  const web = await httpPool();
  const db = await dbPool();
  t.equal((await handoff(web.subdomain, { auth_method: 'postgres_role' })).status, 422);
  for (const m of ['bearer_static', 'api_key', 'basic']) t.equal((await handoff(db.subdomain, { auth_method: m })).status, 422, m);
  const ok = await handoff(db.subdomain, { auth_method: 'postgres_role' });
  t.equal(ok.status, 200);
  t.same(ok.body.required_fields, ['username', 'password']);
  const done = await svc.api('POST', intakePath(ok.body.intake_url), { body: { username: 'app_reader', password: 'pw' } });
  t.equal(done.status, 200);
  t.equal(done.body.data.backend, 'postgres');
  t.equal(done.body.data.has_credential, true);

  for (const body of [{}, { auth_method: 'oauth' }, { auth_method: 'basic', extra: 1 }, { auth_method: 'basic', credential_id: 'x' }, { auth_method: 'basic', credential_name: '  ' }]) {
    t.equal((await handoff(web.subdomain, body)).status, 422, JSON.stringify(body));
  }
  t.equal((await handoff('no-such-pool', { auth_method: 'basic' })).status, 404);
});

t.test('PUT /api/v1/pools/:pool/credential attaches an inline secret or a stored record', async (t) => {
  const pool = await httpPool();
  const put = (body: unknown, sub = pool.subdomain, token = owner.token) => svc.api('PUT', `/api/v1/pools/${sub}/credential`, { token, body });

  const noSecret = await put({ method: 'api_key' });
  t.equal(noSecret.status, 422);
  t.match(noSecret.body.message, /no secret fields/);
  t.equal((await put({})).status, 422);
  t.equal((await put({ api_key: 'k' })).status, 422, 'an http pool without a method needs one');
  t.equal((await put({ method: 'api_key', api_key: 'k', other: 1 })).status, 422, 'unknown property');
  t.equal((await put({ method: 'api_key', token: 'k' })).status, 422, 'field of another method');
  t.equal((await put({ method: 'postgres_role', username: 'u', password: 'p' })).status, 422, 'method that does not fit the backend');

  const ok = await put({ method: 'api_key', api_key: 'key-abc' });
  t.equal(ok.status, 200);
  t.match(ok.body.data, { id: pool.id, has_credential: true });
  const row = await poolRow(pool.id);
  t.match(row, { managed_auth: true, auth_method: 'api_key' });
  const cred = (await svc.sql.query<{ name: string; secret_enc: string }>('SELECT name, secret_enc FROM credentials WHERE id = $1', [row.credential_id!])).rows[0]!;
  t.equal(cred.name, `${pool.subdomain} api_key`);
  t.notOk(cred.secret_enc.includes('key-abc'));
  t.same(JSON.parse(svc.box.open(cred.secret_enc)), { method: 'api_key', api_key: 'key-abc', header_name: 'x-api-key' });

  // The pool now uses api_key: another method is a mismatch; the method may be left out.
  const mismatch = await put({ method: 'bearer_static', token: 't' });
  t.equal(mismatch.status, 422);
  t.match(mismatch.body.message, /method mismatch/);
  t.equal((await put({ api_key: 'key-def', header_name: 'X-Key', name: 'Rotated key' })).status, 200);
  t.equal((await put({ api_key: 'key-ghi', name: 'Rotated key' })).status, 422, 'name taken');

  // A stored record by id; a record of another method or another team is 422.
  const stored = (await poolRow(pool.id)).credential_id!;
  const second = await httpPool();
  const byId = await put({ credential_id: stored }, second.subdomain);
  t.equal(byId.status, 200);
  t.equal((await poolRow(second.id)).credential_id, stored);
  t.equal((await put({ credential_id: stored, token: 'x' }, second.subdomain)).status, 422, 'record and inline secret at once');
  const third = await httpPool();
  await put({ method: 'bearer_static', token: 'b' }, third.subdomain);
  t.equal((await put({ credential_id: stored }, third.subdomain)).status, 422, 'stored record of another method');
  const theirs = await httpPool(other.token);
  t.equal((await put({ credential_id: stored }, theirs.subdomain, other.token)).status, 422, 'another team\'s record is not found');

  const db = await dbPool();
  const dbPut = await put({ username: 'reader', password: 'pw' }, db.subdomain);
  t.equal(dbPut.status, 200, 'a database pool defaults to postgres_role');
  t.match(await poolRow(db.id), { auth_method: 'postgres_role', managed_auth: true });
});
