// Pool keys through the Control API: mint (presets, expires_at, access, read_paths, signing secret), revoke.
import t from 'tap';
import { createHash, randomBytes } from 'node:crypto';
import { startTestApi } from './helpers/service.js';
import { sha256Hex } from '../src/security/tokens.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { findSnapshotKey, listLiveKeys } from '../src/store/keys.js';

const ALL_METHODS = ['GET', 'HEAD', 'OPTIONS', 'POST', 'PUT', 'PATCH', 'DELETE'];
const HOUR = 3_600_000;

const svc = await startTestApi();
t.teardown(() => svc.close());
const sql = svc.sql;
const boot = await svc.bootstrap();
const other = await svc.bootstrap();

async function makePool(teamId: number, settings: object = {}): Promise<{ id: number; subdomain: string }> {
  const subdomain = `p-${randomBytes(4).toString('hex')}`;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, settings)
     VALUES ($1, $2, $2, 'http', 'https://api.example.test', 'api.example.test', $3::jsonb) RETURNING id`,
    [teamId, subdomain, JSON.stringify(settings)],
  );
  return { id: rows[0]!.id, subdomain };
}

const mint = (pool: string, body?: unknown, token: string = boot.token) =>
  svc.api('POST', `/api/v1/pools/${pool}/keys`, body === undefined ? { token } : { token, body });

const countKeys = async (poolId: number) =>
  (await sql.query<{ n: number }>('SELECT count(*)::int AS n FROM pool_keys WHERE pool_id = $1', [poolId])).rows[0]!.n;

t.test('a key minted with no body is a write key with every default, shown in plaintext once', async (t) => {
  const pool = await makePool(boot.team.id);
  const bodies: Array<{ token: string; body?: unknown; rawBody?: string; headers?: Record<string, string> }> = [
    { token: boot.token },
    { token: boot.token, rawBody: '', headers: { 'content-type': 'application/json' } },
    { token: boot.token, body: {} },
  ];
  for (const opts of bodies) {
    const res = await svc.api('POST', `/api/v1/pools/${pool.subdomain}/keys`, opts);
    t.equal(res.status, 201, JSON.stringify(opts));
    const k = res.body.data;
    t.match(k.key, /^pgk_[0-9A-Za-z]{40}$/);
    t.equal(k.last_four, k.key.slice(-4));
    t.equal(k.label, 'key');
    t.equal(k.access, 'write');
    t.same(k.allowed_methods, ALL_METHODS);
    t.equal(k.expires_at, null);
    t.equal(k.revoked_at, null);
    t.ok(Math.abs(Date.parse(k.created_at) - Date.now()) < 60_000, 'created_at is now');
    t.notOk('read_paths' in k);
    t.notOk('signing_secret' in k, 'no signing secret without origin signing');
  }
});

t.test('the store keeps the SHA-256 of the key, never the key itself', async (t) => {
  const pool = await makePool(boot.team.id);
  const res = await mint(pool.subdomain, { label: 'ci runner' });
  const k = res.body.data;
  const { rows } = await sql.query<Record<string, unknown>>('SELECT * FROM pool_keys WHERE id = $1', [k.id]);
  const row = rows[0]!;
  // Against node:crypto's streaming hash, not our helper: hashes stored by any earlier build must keep matching.
  t.equal(row.key_hash, createHash('sha256').update(k.key, 'utf8').digest('hex'));
  t.equal(row.last_four, k.key.slice(-4));
  t.equal(row.label, 'ci runner');
  t.equal(row.signing_secret_enc, null);
  t.notOk(Object.values(row).some((v) => typeof v === 'string' && v.includes(k.key)), 'plaintext key stored nowhere');
  const live = await listLiveKeys(sql, new Date());
  t.match(live.find((l) => l.id === k.id), { pool_id: pool.id, key_hash: sha256Hex(k.key), access: 'write', revoked_at: null });
});

t.test('expiry presets and an explicit expires_at set expires_at', async (t) => {
  const pool = await makePool(boot.team.id);
  for (const [preset, ttl] of [['1h', HOUR], ['24h', 24 * HOUR], ['7d', 7 * 24 * HOUR]] as const) {
    const res = await mint(pool.subdomain, { expires_preset: preset });
    t.equal(res.status, 201, preset);
    const k = res.body.data;
    t.equal(Date.parse(k.expires_at) - Date.parse(k.created_at), ttl, `${preset} is ${ttl} ms after creation`);
  }
  const none = await mint(pool.subdomain, { expires_preset: 'none' });
  t.equal(none.status, 201);
  t.equal(none.body.data.expires_at, null);

  const at = new Date(Date.now() + 3 * HOUR);
  at.setUTCMilliseconds(0);
  const withOffset = `${new Date(at.getTime() + 2 * HOUR).toISOString().slice(0, 19)}+02:00`;
  const explicit = await mint(pool.subdomain, { expires_at: withOffset, label: 'offset' });
  t.equal(explicit.status, 201);
  t.equal(explicit.body.data.expires_at, at.toISOString(), 'an offset date-time is stored as the same instant, shown in UTC');
  const { rows } = await sql.query<{ expires_at: Date }>('SELECT expires_at FROM pool_keys WHERE id = $1', [explicit.body.data.id]);
  t.equal(rows[0]!.expires_at.getTime(), at.getTime());

  const nullAt = await mint(pool.subdomain, { expires_at: null, expires_preset: '1h' });
  t.equal(nullAt.status, 201, 'expires_at null means not given');
});

t.test('invalid mint requests are 422 and change nothing', async (t) => {
  const pool = await makePool(boot.team.id);
  const soon = new Date(Date.now() + HOUR).toISOString();
  const cases: Array<[string, unknown, RegExp]> = [
    ['label of 61 characters', { label: 'x'.repeat(61) }, /label/],
    ['empty label', { label: '' }, /label/],
    ['label with a control character', { label: 'a\nb' }, /label/],
    ['unknown property', { label: 'ok', scopes: ['all'] }, /unknown property "scopes"/],
    ['preset and expires_at', { expires_preset: '1h', expires_at: soon }, /either expires_preset or expires_at/],
    ['preset none and expires_at', { expires_preset: 'none', expires_at: soon }, /either expires_preset or expires_at/],
    ['expires_at in the past', { expires_at: new Date(Date.now() - 1000).toISOString() }, /future/],
    ['expires_at beyond a year', { expires_at: new Date(Date.now() + 366 * 24 * HOUR).toISOString() }, /365 days/],
    ['expires_at without a time zone', { expires_at: '2099-01-01T00:00:00' }, /expires_at/],
    ['expires_at not a date', { expires_at: 'tomorrow' }, /expires_at/],
    ['unknown preset', { expires_preset: '2h' }, /expires_preset/],
    ['unknown access', { access: 'admin' }, /access/],
    ['a JSON array body', [], /body/],
    ['a JSON null body', null, /body/],
    ['a JSON string body', 'read', /body/],
  ];
  for (const [name, body, message] of cases) {
    const res = await mint(pool.subdomain, body);
    t.equal(res.status, 422, name);
    t.match(res.body?.message, message, name);
  }
  const sixty = await mint(pool.subdomain, { label: 'é'.repeat(60) });
  t.equal(sixty.status, 201, 'a 60-character label is accepted');
  t.equal(sixty.body.data.label, 'é'.repeat(60));
  t.equal(await countKeys(pool.id), 1, 'only the valid request minted a key');
});

t.test('read keys admit GET, HEAD, OPTIONS plus the pool\'s read methods, reported with read_paths', async (t) => {
  const plain = await makePool(boot.team.id);
  const read = await mint(plain.subdomain, { access: 'read' });
  t.equal(read.status, 201);
  t.equal(read.body.data.access, 'read');
  t.same(read.body.data.allowed_methods, ['GET', 'HEAD', 'OPTIONS']);
  t.notOk('read_paths' in read.body.data, 'no read_paths when the pool scopes nothing');

  const search = await makePool(boot.team.id, { readMethods: ['POST'], readPaths: { POST: ['/search'] } });
  const scoped = await mint(search.subdomain, { access: 'read', label: 'search' });
  t.equal(scoped.status, 201);
  t.same(scoped.body.data.allowed_methods, ['GET', 'HEAD', 'OPTIONS', 'POST']);
  t.same(scoped.body.data.read_paths, { POST: ['/search'] });

  const write = await mint(search.subdomain, { access: 'write' });
  t.same(write.body.data.allowed_methods, ALL_METHODS);
  t.notOk('read_paths' in write.body.data, 'write keys are not path-scoped');

  const unscoped = await makePool(boot.team.id, { readMethods: ['POST'] });
  const r2 = await mint(unscoped.subdomain, { access: 'read' });
  t.same(r2.body.data.allowed_methods, ['GET', 'HEAD', 'OPTIONS', 'POST']);
  t.notOk('read_paths' in r2.body.data, 'an extra read method without path prefixes has no read_paths');

  const { rows } = await sql.query<{ access: string }>('SELECT access FROM pool_keys WHERE id = $1', [scoped.body.data.id]);
  t.equal(rows[0]!.access, 'read');
});

t.test('a signing secret is returned once, and stored sealed, only when the pool has origin signing', async (t) => {
  const pool = await makePool(boot.team.id, { originSigning: true });
  const res = await mint(pool.subdomain, { label: 'signed' });
  t.equal(res.status, 201);
  const secret = res.body.data.signing_secret;
  t.match(secret, /^pks_[0-9A-Za-z]{40}$/);
  const { rows } = await sql.query<{ signing_secret_enc: string }>('SELECT signing_secret_enc FROM pool_keys WHERE id = $1', [res.body.data.id]);
  const sealed = rows[0]!.signing_secret_enc;
  t.notOk(sealed.includes(secret), 'stored encrypted');
  t.equal(svc.box.open(sealed), secret);

  const revoked = await svc.api('DELETE', `/api/v1/pools/${pool.subdomain}/keys/${res.body.data.id}`, { token: boot.token });
  t.notOk('signing_secret' in revoked.body.data, 'never shown again');
  t.notOk('key' in revoked.body.data);
});

t.test('keys:write is required; another team\'s pool and unknown pools are 404', async (t) => {
  const pool = await makePool(boot.team.id);
  const limited = await svc.admin(['token', 'create', '--team', boot.team.slug, '--user', String(boot.user.id), '--abilities', 'pools:read']);
  const denied = await mint(pool.subdomain, { label: 'nope' }, limited.token);
  t.equal(denied.status, 403);
  t.match(denied.body.message, /keys:write/);
  t.equal(await countKeys(pool.id), 0);
  t.equal((await mint(pool.subdomain, { label: 'x'.repeat(61) }, limited.token)).status, 403, 'the ability is checked before the body');
  t.equal((await svc.api('DELETE', `/api/v1/pools/${pool.subdomain}/keys/abc`, { token: limited.token })).status, 403);

  const made = await mint(pool.subdomain);
  const delDenied = await svc.api('DELETE', `/api/v1/pools/${pool.subdomain}/keys/${made.body.data.id}`, { token: limited.token });
  t.equal(delDenied.status, 403);
  t.equal((await findSnapshotKey(sql, made.body.data.id))?.revoked_at, null, 'a refused revoke changes nothing');

  const foreign = await mint(pool.subdomain, {}, other.token);
  t.equal(foreign.status, 404, 'another team\'s pool is not found');
  t.same(foreign.body, { message: 'pool not found' });
  t.equal((await mint('no-such-pool')).status, 404);
  t.equal((await svc.api('DELETE', `/api/v1/pools/${pool.subdomain}/keys/${made.body.data.id}`, { token: other.token })).status, 404);
  t.equal((await svc.api('POST', `/api/v1/pools/${pool.subdomain}/keys`, {})).status, 401);
});

t.test('revoke sets revoked_at once; unknown ids and keys of other pools are 404', async (t) => {
  const pool = await makePool(boot.team.id);
  const otherPool = await makePool(boot.team.id);
  const k = (await mint(pool.subdomain, { access: 'read', expires_preset: '24h' })).body.data;
  const elsewhere = (await mint(otherPool.subdomain)).body.data;

  const res = await svc.api('DELETE', `/api/v1/pools/${pool.subdomain}/keys/${k.id}`, { token: boot.token });
  t.equal(res.status, 200);
  const r = res.body.data;
  t.match(r, { id: k.id, label: 'key', last_four: k.last_four, access: 'read', allowed_methods: ['GET', 'HEAD', 'OPTIONS'], expires_at: k.expires_at, created_at: k.created_at });
  t.ok(r.revoked_at && Math.abs(Date.parse(r.revoked_at) - Date.now()) < 60_000, 'revoked_at is now');

  const again = await svc.api('DELETE', `/api/v1/pools/${pool.subdomain}/keys/${k.id}`, { token: boot.token });
  t.equal(again.status, 200, 'revoking twice is not an error');
  t.equal(again.body.data.revoked_at, r.revoked_at, 'the first revoked_at is kept');

  const crossPool = await svc.api('DELETE', `/api/v1/pools/${pool.subdomain}/keys/${elsewhere.id}`, { token: boot.token });
  t.equal(crossPool.status, 404, 'a key of another pool is not found');
  t.same(crossPool.body, { message: 'key not found' });
  t.equal((await findSnapshotKey(sql, elsewhere.id))?.revoked_at, null, 'and is not revoked');
  for (const id of ['999999', '0', '-1', 'abc', '1.5', '99999999999']) {
    t.equal((await svc.api('DELETE', `/api/v1/pools/${pool.subdomain}/keys/${id}`, { token: boot.token })).status, 404, id);
  }

  const live = await listLiveKeys(sql, new Date());
  t.notOk(live.some((l) => l.id === k.id), 'a revoked key leaves the live set');
  t.ok(live.some((l) => l.id === elsewhere.id));
  t.ok((await findSnapshotKey(sql, k.id))?.revoked_at instanceof Date, 'the change-feed lookup reports the revocation');
});

t.test('an expired key keeps its expires_at and leaves the live set', async (t) => {
  const pool = await makePool(boot.team.id);
  const k = (await mint(pool.subdomain, { expires_preset: '1h' })).body.data;
  t.ok((await listLiveKeys(sql, new Date())).some((l) => l.id === k.id));
  const later = new Date(Date.parse(k.expires_at) + 1);
  t.notOk((await listLiveKeys(sql, later)).some((l) => l.id === k.id), 'not live once expires_at has passed');
  const snap = await findSnapshotKey(sql, k.id);
  t.equal(snap?.expires_at?.toISOString(), k.expires_at);
});

t.test('mint and revoke notify the change feed with key:<id>', async (t) => {
  const pool = await makePool(boot.team.id);
  const seen: string[] = [];
  const unlisten = await sql.listen(CHANGE_CHANNEL, (p) => seen.push(p));
  t.teardown(unlisten);
  const k = (await mint(pool.subdomain)).body.data;
  await svc.api('DELETE', `/api/v1/pools/${pool.subdomain}/keys/${k.id}`, { token: boot.token });
  const deadline = Date.now() + 5000;
  while (seen.filter((p) => p === `key:${k.id}`).length < 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  t.equal(seen.filter((p) => p === `key:${k.id}`).length, 2, 'one notification for the mint, one for the revoke');
});

t.test('the OpenAPI document describes both key endpoints with the PoolKey schema', async (t) => {
  const res = await svc.api('GET', '/api/v1/openapi.json');
  t.equal(res.status, 200);
  const paths = res.body.paths;
  t.ok(paths['/api/v1/pools/{pool}/keys']?.post, 'mint is documented');
  t.ok(paths['/api/v1/pools/{pool}/keys/{apiKey}']?.delete, 'revoke is documented');
  t.ok(res.body.components.schemas.PoolKey);
});
