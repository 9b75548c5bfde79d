import t from 'tap';
import { until } from './helpers/until.js';
import { startTestApi, type TestApi } from './helpers/service.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { needServer } from './helpers/servers.js';

const SUBDOMAIN = /^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$/;

let svc: TestApi;
let owner: Awaited<ReturnType<TestApi['bootstrap']>>;
let other: Awaited<ReturnType<TestApi['bootstrap']>>;

t.before(async () => {
  svc = await startTestApi();
  owner = await svc.bootstrap({ team: 'Pool Owners' });
  other = await svc.bootstrap({ team: 'Other Team' });
});
t.teardown(() => svc?.close());

t.test('POST /api/v1/pools creates a pass-through pool with default settings (201), reuses it for the same host (200)', async (t) => {
  const seen: string[] = [];
  const unlisten = await svc.sql.listen(CHANGE_CHANNEL, (p) => seen.push(p));
  t.teardown(unlisten);

  const created = await svc.api('POST', '/api/v1/pools', { token: owner.token, body: { origin: 'https://api.example.com' } });
  t.equal(created.status, 201);
  const pool = created.body.data;
  t.match(pool, {
    name: 'api.example.com',
    subdomain: 'api-example-com',
    backend: 'http',
    max_concurrent: 10,
    require_key: true,
    has_credential: false,
    budget: null,
  });
  t.type(pool.id, 'number');

  for (const origin of ['https://api.example.com/', 'https://API.Example.com:443', 'https://api.example.com:443/']) {
    const again = await svc.api('POST', '/api/v1/pools', { token: owner.token, body: { origin, name: 'ignored on reuse' } });
    t.equal(again.status, 200, `${origin} reuses the live pool`);
    t.equal(again.body.data.id, pool.id);
  }
  // Another port is another origin host.
  const port = await svc.api('POST', '/api/v1/pools', { token: owner.token, body: { origin: 'https://api.example.com:8443', name: null } });
  t.equal(port.status, 201);
  t.equal(port.body.data.name, 'api.example.com:8443');
  t.not(port.body.data.id, pool.id);

  const list = await svc.api('GET', '/api/v1/pools', { token: owner.token });
  t.equal(list.status, 200);
  t.same(list.body.data.map((p: { id: number }) => p.id), [pool.id, port.body.data.id]);
  const one = await svc.api('GET', `/api/v1/pools/${pool.subdomain}`, { token: owner.token });
  t.equal(one.status, 200);
  t.same(one.body.data, pool);

  await until('the create announced on the change feed', () => seen.includes(`pool:${pool.id}`));
  t.pass('a create is announced on the change feed');
});

t.test('explicit names: taken → 422; subdomains are DNS labels ≤ 40 characters, unique across teams', async (t) => {
  const a = await svc.api('POST', '/api/v1/pools', { token: owner.token, body: { origin: 'https://shop.example.com', name: 'Shop' } });
  t.equal(a.status, 201);
  t.equal(a.body.data.name, 'Shop');
  t.equal(a.body.data.subdomain, 'shop');

  const taken = await svc.api('POST', '/api/v1/pools', { token: owner.token, body: { origin: 'https://shop2.example.com', name: 'Shop' } });
  t.equal(taken.status, 422);
  t.match(taken.body.message, /already exists/);

  // The same name in another team is fine; the subdomain is global, so it gets a random suffix.
  const b = await svc.api('POST', '/api/v1/pools', { token: other.token, body: { origin: 'https://shop.example.com', name: 'Shop' } });
  t.equal(b.status, 201);
  t.match(b.body.data.subdomain, /^shop-[a-z0-9]{6}$/);

  const long = await svc.api('POST', '/api/v1/pools', {
    token: owner.token,
    body: { origin: 'https://x.example.com', name: 'A Very Long Pool Name That Keeps Going Well Past Forty Characters!!' },
  });
  t.equal(long.status, 201);
  t.ok(long.body.data.subdomain.length <= 40);
  t.match(long.body.data.subdomain, SUBDOMAIN);

  const accented = await svc.api('POST', '/api/v1/pools', { token: owner.token, body: { origin: 'https://creme.example.com', name: 'Crème Brûlée API' } });
  t.equal(accented.body.data.subdomain, 'creme-brulee-api');

  // Labels that name the service's own routes are never used bare.
  const reserved = await svc.api('POST', '/api/v1/pools', { token: owner.token, body: { origin: 'https://db.example.com', name: 'database' } });
  t.equal(reserved.status, 201);
  t.match(reserved.body.data.subdomain, /^database-[a-z0-9]{6}$/);

  for (const name of ['', '   ', 'tab\there']) {
    const bad = await svc.api('POST', '/api/v1/pools', { token: owner.token, body: { origin: 'https://n.example.com', name } });
    t.equal(bad.status, 422, JSON.stringify(name));
  }
});

t.test('invalid origins and unknown properties are 422 and create nothing', async (t) => {
  const before = (await svc.api('GET', '/api/v1/pools', { token: owner.token })).body.data.length;
  const bad: unknown[] = [
    { origin: 'http://api.example.com' },
    { origin: 'https://api.example.com/v1' },
    { origin: 'https://api.example.com?x=1' },
    { origin: 'https://api.example.com?' },
    { origin: 'https://api.example.com#frag' },
    { origin: 'https://user:pw@api.example.com' },
    { origin: 'not a url' },
    { origin: '' },
    { origin: 42 },
    {},
    { origin: 'https://api.example.com', extra: true },
    { origin: 'https://api.example.com', name: 5 },
    // The service's own hosts are refused even when private targets are allowed.
    { origin: 'https://demo.pools.localhost' },
  ];
  for (const body of bad) {
    const res = await svc.api('POST', '/api/v1/pools', { token: owner.token, body });
    t.equal(res.status, 422, JSON.stringify(body));
    t.type(res.body.message, 'string');
  }
  t.equal((await svc.api('GET', '/api/v1/pools', { token: owner.token })).body.data.length, before);
});

t.test('concurrent creates for one origin yield one pool: one 201, the rest 200 with the same id', async (t) => {
  const results = await Promise.all(
    Array.from({ length: 8 }, () => svc.api('POST', '/api/v1/pools', { token: owner.token, body: { origin: 'https://race.example.com' } })),
  );
  t.same(results.map((r) => r.status).sort(), [200, 200, 200, 200, 200, 200, 200, 201]);
  t.equal(new Set(results.map((r) => r.body.data.id)).size, 1);
});

t.test('POST /api/v1/pools/database: postgres by default, mysql on 3306, reuse by host+port+name', async (t) => {
  const pg = await svc.api('POST', '/api/v1/pools/database', { token: owner.token, body: { db_host: 'db.example.com', db_name: 'orders' } });
  t.equal(pg.status, 201);
  t.match(pg.body.data, { backend: 'postgres', name: 'db.example.com/orders', subdomain: 'db-example-com-orders', max_concurrent: 10, require_key: true, has_credential: false });
  const row = (await svc.sql.query<{ db_port: number; db_sslmode: string }>('SELECT db_port, db_sslmode FROM pools WHERE id = $1', [pg.body.data.id])).rows[0]!;
  t.same(row, { db_port: 5432, db_sslmode: 'verify-full' });

  const same = await svc.api('POST', '/api/v1/pools/database', {
    token: owner.token,
    body: { db_host: 'DB.example.com', db_name: 'orders', db_port: 5432, db_sslmode: 'require', name: null },
  });
  t.equal(same.status, 200);
  t.equal(same.body.data.id, pg.body.data.id);

  const my = await svc.api('POST', '/api/v1/pools/database', { token: owner.token, body: { db_host: 'db.example.com', db_name: 'orders', db_port: 3306, name: 'Orders MySQL' } });
  t.equal(my.status, 201);
  t.equal(my.body.data.backend, 'mysql');
  t.equal(my.body.data.name, 'Orders MySQL');

  const odd = await svc.api('POST', '/api/v1/pools/database', { token: owner.token, body: { db_host: 'db.example.com', db_name: 'orders', db_port: 6543 } });
  t.equal(odd.status, 201);
  t.equal(odd.body.data.backend, 'postgres');
  t.equal(odd.body.data.name, 'db.example.com:6543/orders');

  const bad: unknown[] = [
    { db_name: 'x' },
    { db_host: 'db.example.com' },
    { db_host: 'postgres://db.example.com', db_name: 'x' },
    { db_host: 'db.example.com:5432', db_name: 'x' },
    { db_host: 'db.example.com', db_name: 'x', db_port: 0 },
    { db_host: 'db.example.com', db_name: 'x', db_port: 65536 },
    { db_host: 'db.example.com', db_name: 'x', db_port: '5432' },
    { db_host: 'db.example.com', db_name: 'x', db_sslmode: 'disable' },
    { db_host: 'db.example.com', db_name: 'x', backend: 'http' },
    { db_host: 'x.pools.localhost', db_name: 'x' },
    { db_host: 'db.example.com', db_name: 'orders', name: 'Orders MySQL', db_port: 1234 },
  ];
  for (const body of bad) {
    const res = await svc.api('POST', '/api/v1/pools/database', { token: owner.token, body });
    t.equal(res.status, 422, JSON.stringify(body));
  }
});

t.test('abilities: a pools:read token reads but gets 403 on every pool write; no token is 401', async (t) => {
  const ro = await svc.admin(['token', 'create', '--team', owner.team.slug, '--user', String(owner.user.id), '--abilities', 'pools:read']);
  const pool = (await svc.api('POST', '/api/v1/pools', { token: owner.token, body: { origin: 'https://ro.example.com' } })).body.data;
  t.equal((await svc.api('GET', '/api/v1/pools', { token: ro.token })).status, 200);
  t.equal((await svc.api('GET', `/api/v1/pools/${pool.subdomain}`, { token: ro.token })).status, 200);
  const writes: [string, string, unknown][] = [
    ['POST', '/api/v1/pools', { origin: 'https://ro2.example.com' }],
    ['POST', '/api/v1/pools/database', { db_host: 'db.example.com', db_name: 'ro' }],
    ['POST', `/api/v1/pools/${pool.subdomain}/auth-handoff`, { auth_method: 'bearer_static' }],
    ['PUT', `/api/v1/pools/${pool.subdomain}/credential`, { method: 'bearer_static', token: 'x' }],
  ];
  for (const [method, path, body] of writes) {
    const res = await svc.api(method as 'POST', path, { token: ro.token, body });
    t.equal(res.status, 403, `${method} ${path}`);
    t.match(res.body, { message: /pools:write/ });
  }
  const keysOnly = await svc.admin(['token', 'create', '--team', owner.team.slug, '--user', String(owner.user.id), '--abilities', 'keys:write']);
  t.equal((await svc.api('GET', '/api/v1/pools', { token: keysOnly.token })).status, 403);
  t.equal((await svc.api('GET', `/api/v1/pools/${pool.subdomain}`, { token: keysOnly.token })).status, 403);
  t.equal((await svc.api('GET', '/api/v1/pools')).status, 401);
  t.equal((await svc.api('POST', '/api/v1/pools', { body: { origin: 'https://x.example.com' } })).status, 401);
});

t.test('another team\'s pool is 404, and so is an unknown or malformed subdomain', async (t) => {
  const theirs = (await svc.api('POST', '/api/v1/pools', { token: other.token, body: { origin: 'https://theirs.example.com' } })).body.data;
  t.equal((await svc.api('GET', `/api/v1/pools/${theirs.subdomain}`, { token: owner.token })).status, 404);
  t.notOk((await svc.api('GET', '/api/v1/pools', { token: owner.token })).body.data.some((p: { id: number }) => p.id === theirs.id));
  t.equal((await svc.api('POST', `/api/v1/pools/${theirs.subdomain}/auth-handoff`, { token: owner.token, body: { auth_method: 'bearer_static' } })).status, 404);
  t.equal((await svc.api('PUT', `/api/v1/pools/${theirs.subdomain}/credential`, { token: owner.token, body: { method: 'bearer_static', token: 'x' } })).status, 404);
  t.equal((await svc.api('GET', '/api/v1/pools/no-such-pool', { token: owner.token })).status, 404);
  t.equal((await svc.api('GET', '/api/v1/pools/Bad_Label', { token: owner.token })).status, 404);
  // Reuse is per team: the same origin in this team is a new pool.
  const mine = await svc.api('POST', '/api/v1/pools', { token: owner.token, body: { origin: 'https://theirs.example.com' } });
  t.equal(mine.status, 201);
  t.not(mine.body.data.id, theirs.id);
});

t.test('the target guard refuses private, loopback and unresolvable hosts after DNS resolution', async (t) => {
  const guarded = await startTestApi({
    overrides: { allowPrivateTargets: false },
    lookup: async (host) => {
      const table: Record<string, string[]> = {
        'api.example.com': ['93.184.216.34'],
        'evil.example.com': ['10.0.0.5'],
        'mixed.example.com': ['93.184.216.34', '169.254.169.254'],
        'db.example.com': ['93.184.216.35'],
      };
      const found = table[host];
      if (!found) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
      return found;
    },
  });
  t.teardown(() => guarded.close());
  const boot = await guarded.bootstrap();

  const ok = await guarded.api('POST', '/api/v1/pools', { token: boot.token, body: { origin: 'https://api.example.com' } });
  t.equal(ok.status, 201);
  for (const origin of ['https://evil.example.com', 'https://mixed.example.com', 'https://10.0.0.5', 'https://127.0.0.1:8443', 'https://[::1]', 'https://localhost', 'https://nowhere.example.com']) {
    const res = await guarded.api('POST', '/api/v1/pools', { token: boot.token, body: { origin } });
    t.equal(res.status, 422, origin);
    t.match(res.body.message, /refused/);
  }
  t.equal((await guarded.api('POST', '/api/v1/pools/database', { token: boot.token, body: { db_host: 'db.example.com', db_name: 'app' } })).status, 201);
  for (const db_host of ['evil.example.com', 'localhost', '192.168.1.10', '::1']) {
    const res = await guarded.api('POST', '/api/v1/pools/database', { token: boot.token, body: { db_host, db_name: 'app' } });
    t.equal(res.status, 422, db_host);
  }
  t.equal((await guarded.api('GET', '/api/v1/pools', { token: boot.token })).body.data.length, 2, 'refusals created nothing');
});

t.test('on PostgreSQL (real concurrency), racing creates and racing intake posts still have one winner', async (t) => {
  const skip = await needServer('postgres');
  if (skip) return t.skip(skip);
  const pgsvc = await startTestApi({ engine: 'postgres' });
  t.teardown(() => pgsvc.close());
  const boot = await pgsvc.bootstrap();
  const creates = await Promise.all(
    Array.from({ length: 10 }, (_, i) =>
      pgsvc.api('POST', '/api/v1/pools', { token: boot.token, body: { origin: 'https://race.example.com', name: i % 2 ? `Race ${i}` : null } }),
    ),
  );
  t.same(creates.map((r) => r.status).sort(), [200, 200, 200, 200, 200, 200, 200, 200, 200, 201]);
  t.equal(new Set(creates.map((r) => r.body.data.id)).size, 1);
  const named = await Promise.all(
    Array.from({ length: 6 }, (_, i) => pgsvc.api('POST', '/api/v1/pools', { token: boot.token, body: { origin: `https://n${i}.example.com`, name: 'Same Name' } })),
  );
  t.same(named.map((r) => r.status).sort(), [201, 422, 422, 422, 422, 422], 'racing explicit names: one wins, the rest are 422, none 500');

  const pool = creates[0]!.body.data;
  const h = await pgsvc.api('POST', `/api/v1/pools/${pool.subdomain}/auth-handoff`, { token: boot.token, body: { auth_method: 'bearer_static' } });
  const path = new URL(h.body.intake_url).pathname;
  const posts = await Promise.all(Array.from({ length: 6 }, (_, i) => pgsvc.api('POST', path, { body: { token: `t${i}` } })));
  t.same(posts.map((r) => r.status).sort(), [200, 410, 410, 410, 410, 410]);
  const { rows } = await pgsvc.sql.query<{ n: number }>('SELECT count(*)::int AS n FROM credentials');
  t.equal(rows[0]!.n, 1, 'one credential was created');
});
