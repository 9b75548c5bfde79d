// Issue 20 items 6 and 7: the admin commands an operator reaches for first (--team by slug, name or id; an idempotent
// bootstrap that never makes acme-2; pool list/create/delete; key list/create/revoke) and pool deletion through the
// Control API (in the OpenAPI document; keys revoked, traffic refused, the subdomain not reused).
import t from 'tap';
import { request } from 'undici';
import { helpText, parseAdmin, runAdmin } from '../src/admin/commands.js';
import { startTestService } from './helpers/service.js';
import { startOrigin } from './helpers/origin.js';

t.test('every admin command the help lists answers --help with its own usage (no store is needed for it)', async (t) => {
  const names = [...helpText().matchAll(/poolgate admin ((?:[a-z]+ ?)+?) (?=-|\[|$)/gm)].map((m) => m[1]!.trim());
  t.ok(names.includes('bootstrap') && names.includes('token create') && names.includes('pool create'), `commands listed: ${names.join(', ')}`);
  for (const name of names) {
    const inv = parseAdmin([...name.split(' '), '--help']);
    t.ok('answer' in inv, `admin ${name} --help is answered by the parse`);
    if (!('answer' in inv)) continue;
    t.equal(inv.answer.code, 0, `admin ${name} --help exits 0`);
    t.match(inv.answer.stdout, new RegExp(`^usage: poolgate admin ${name}\\b`), `admin ${name} --help prints its usage`);
  }
});

t.test('admin: bootstrap, --team by name, pools and keys', async (t) => {
  const origin = await startOrigin();
  t.teardown(() => origin.close());
  const svc = await startTestService({ overrides: { originCaFile: origin.caFile } });
  t.teardown(() => svc.close());
  const deps = { config: svc.config, sql: svc.service.sql, box: svc.service.box, now: () => new Date() };
  const admin = async (...argv: string[]) => {
    const r = await runAdmin(argv, deps);
    return { ...r, json: r.code === 0 ? JSON.parse(r.stdout) : null };
  };

  const first = await admin('bootstrap', '--team', 'Acme Ops', '--email', 'ops@acme.test', '--plan', 'team');
  t.equal(first.code, 0, first.stderr);
  t.match(first.json, { created: true, team: { name: 'Acme Ops', slug: 'acme-ops' } });
  const again = await admin('bootstrap', '--team', 'Acme Ops', '--email', 'ops@acme.test', '--plan', 'team');
  t.equal(again.code, 0, 'the same bootstrap again succeeds');
  t.match(again.json, { created: false, team: { id: first.json.team.id, slug: 'acme-ops' }, user: { id: first.json.user.id } }, 'same team, same owner');
  t.not(again.json.token, first.json.token, 'with a new token');
  const other = await admin('bootstrap', '--team', 'Acme Ops', '--email', 'someone@else.test');
  t.equal(other.code, 2, 'another email for an existing team is refused');
  t.match(other.stderr, /already exists and someone@else\.test is not its owner; nothing changed/);
  const teams = await svc.service.sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM teams WHERE slug LIKE 'acme-ops%'`);
  t.equal(teams.rows[0]!.n, 1, 'no acme-ops-2');

  // --team: the slug, the name (any case) or the id.
  for (const ref of ['acme-ops', 'Acme Ops', 'acme ops', String(first.json.team.id)]) {
    const list = await admin('pool', 'list', '--team', ref);
    t.equal(list.code, 0, `--team ${ref}: ${list.stderr}`);
  }
  t.match((await admin('pool', 'list', '--team', 'nope')).stderr, /team "nope" not found \(give its slug, name or id\)/);

  const created = await admin('pool', 'create', '--team', 'Acme Ops', '--origin', origin.url);
  t.equal(created.code, 0, created.stderr);
  const sub = created.json.data.subdomain as string;
  t.match(created.json, { created: true, data: { backend: 'http' } });
  const listed = await admin('pool', 'list', '--team', 'acme-ops');
  t.same(listed.json.data.map((p: { subdomain: string }) => p.subdomain), [sub]);
  t.equal(listed.json.data[0].origin, origin.url);

  const key = await admin('key', 'create', sub, '--team', 'acme-ops', '--label', 'ops');
  t.equal(key.code, 0, key.stderr);
  t.match(key.json.data, { key: /^\S+$/, label: 'ops', access: 'write' });
  const keys = await admin('key', 'list', sub, '--team', 'acme-ops');
  t.equal(keys.json.data.length, 1);
  t.notOk(keys.json.data[0].key, 'a listing never shows a key');
  t.equal(keys.json.data[0].last_four, key.json.data.key.slice(-4));

  await svc.service.dataplane!.snapshots.reload();
  const through = await request(`${svc.proxyUrl}/x`, { headers: { host: `${sub}.${svc.config.poolDomain}`, 'x-service-key': key.json.data.key } });
  t.equal(through.statusCode, 200, 'the key minted by the CLI works');
  await through.body.dump();

  const revoked = await admin('key', 'revoke', sub, '--team', 'acme-ops', '--id', String(key.json.data.id));
  t.equal(revoked.code, 0, revoked.stderr);
  t.ok(revoked.json.data.revoked_at);
  await svc.service.dataplane!.snapshots.reload();
  const refused = await request(`${svc.proxyUrl}/x`, { headers: { host: `${sub}.${svc.config.poolDomain}`, 'x-service-key': key.json.data.key } });
  t.equal(refused.statusCode, 401, 'the revoked key is refused');
  await refused.body.dump();

  const deleted = await admin('pool', 'delete', sub, '--team', 'acme-ops');
  t.equal(deleted.code, 0, deleted.stderr);
  t.same((await admin('pool', 'list', '--team', 'acme-ops')).json.data, []);
  t.equal((await admin('pool', 'delete', sub, '--team', 'acme-ops')).code, 2, 'deleting again: not found');

  t.equal((await admin('pool', 'create', '--team', 'acme-ops', '--origin', 'http://plain.example')).code, 2, 'a refused origin is a usage error');
  t.equal((await admin('key', 'list', sub, '--team', 'acme-ops', '--bogus')).code, 2, 'unknown flags are errors');
});

t.test('DELETE /api/v1/pools/{pool}: in the OpenAPI document; keys revoked, traffic refused, subdomain kept', async (t) => {
  const origin = await startOrigin();
  t.teardown(() => origin.close());
  const svc = await startTestService({ overrides: { originCaFile: origin.caFile } });
  t.teardown(() => svc.close());
  const { token } = await svc.bootstrap();
  const spec = (await (await request(`${svc.controlUrl}/api/v1/openapi.json`)).body.json()) as { paths: Record<string, Record<string, unknown>> };
  t.ok(spec.paths['/api/v1/pools/{pool}']!.delete, 'DELETE /api/v1/pools/{pool} is in the OpenAPI document');

  const pool = await svc.api('POST', '/api/v1/pools', { token, body: { origin: origin.url } });
  const sub = pool.body.data.subdomain as string;
  const key = await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token });
  await svc.service.dataplane!.snapshots.reload();
  const host = `${sub}.${svc.config.poolDomain}`;
  const ok = await request(`${svc.proxyUrl}/x`, { headers: { host, 'x-service-key': key.body.data.key } });
  t.equal(ok.statusCode, 200);
  await ok.body.dump();

  // A token without pools:write may not delete.
  const me = (await svc.api('GET', '/api/v1/me', { token })).body;
  const readOnly = await svc.admin(['token', 'create', '--team', String(me.team.id), '--user', me.user.email, '--abilities', 'pools:read']);
  t.equal((await svc.api('DELETE', `/api/v1/pools/${sub}`, { token: readOnly.token })).status, 403);

  const del = await svc.api('DELETE', `/api/v1/pools/${sub}`, { token });
  t.equal(del.status, 200);
  t.equal(del.body.data.subdomain, sub);
  t.equal((await svc.api('GET', `/api/v1/pools/${sub}`, { token })).status, 404);
  t.equal((await svc.api('DELETE', `/api/v1/pools/${sub}`, { token })).status, 404, 'a second delete: not found');
  const keyRow = await svc.service.sql.query<{ revoked_at: Date | null }>('SELECT revoked_at FROM pool_keys WHERE id = $1', [key.body.data.id]);
  t.ok(keyRow.rows[0]!.revoked_at, 'its keys are revoked');

  await svc.service.dataplane!.snapshots.reload();
  const gone = await request(`${svc.proxyUrl}/x`, { headers: { host, 'x-service-key': key.body.data.key } });
  t.equal(gone.statusCode, 404, 'traffic to a deleted pool: no pool at this host');
  await gone.body.dump();

  // A new pool for the same origin gets another subdomain: old clients never reach it.
  const again = await svc.api('POST', '/api/v1/pools', { token, body: { origin: origin.url } });
  t.equal(again.status, 201);
  t.not(again.body.data.subdomain, sub);
});

t.test('X-Service-Pool names the pool when the Host is not under the pool domain, and only then', async (t) => {
  const origin = await startOrigin();
  t.teardown(() => origin.close());
  const svc = await startTestService({ overrides: { originCaFile: origin.caFile } });
  t.teardown(() => svc.close());
  const { token } = await svc.bootstrap();
  const a = (await svc.api('POST', '/api/v1/pools', { token, body: { origin: origin.url } })).body.data.subdomain as string;
  const key = (await svc.api('POST', `/api/v1/pools/${a}/keys`, { token })).body.data.key as string;
  await svc.service.dataplane!.snapshots.reload();
  // fetch sends Host: 127.0.0.1:<port> whatever it is told.
  const res = await fetch(`${svc.proxyUrl}/thing`, { headers: { 'X-Service-Pool': a.toUpperCase(), 'X-Service-Key': key } });
  t.equal(res.status, 200, 'fetch reaches the pool by X-Service-Pool (any case)');
  await res.arrayBuffer();
  t.notOk(origin.requests.at(-1)!.headers['x-service-pool'], 'the header is not forwarded');
  const none = await fetch(`${svc.proxyUrl}/thing`, { headers: { 'X-Service-Key': key } });
  t.equal(none.status, 404);
  t.match(await none.json(), { error: 'not_found', message: /X-Service-Pool/ }, 'the 404 says how to name a pool');
  const wrongHost = await request(`${svc.proxyUrl}/thing`, { headers: { host: `nope.${svc.config.poolDomain}`, 'x-service-pool': a, 'x-service-key': key } });
  t.equal(wrongHost.statusCode, 404, 'a Host under the pool domain wins: the header does not redirect it');
  await wrongHost.body.dump();
});

t.test('database pools: the engine is explicit with backend; without it, 3306 means mysql (issue 20 item 4)', async (t) => {
  const svc = await startTestService();
  t.teardown(() => svc.close());
  const { token } = await svc.bootstrap();
  const create = (body: Record<string, unknown>) => svc.api('POST', '/api/v1/pools/database', { token, body: { db_host: '127.0.0.1', db_name: 'app', ...body } });
  const my = await create({ backend: 'mysql' });
  t.equal(my.status, 201);
  t.equal(my.body.data.backend, 'mysql', 'backend mysql without a port: mysql on 3306');
  const pgPool = await create({});
  t.equal(pgPool.status, 201, 'the same host and database without backend is another pool, not the mysql one reused');
  t.equal(pgPool.body.data.backend, 'postgres');
  const again = await create({ backend: 'mysql', db_port: 3306 });
  t.equal(again.status, 200, 'the mysql pool is reused for the same engine, host, port and database');
  t.equal(again.body.data.id, my.body.data.id);
  const other = await create({ backend: 'mysql', db_port: 3307 });
  t.equal(other.status, 201);
  t.equal(other.body.data.backend, 'mysql', 'a MySQL server on another port');
  const inferred = await create({ db_name: 'other', db_port: 3306 });
  t.equal(inferred.body.data.backend, 'mysql', 'the spec\'s rule still holds without backend');
  t.equal((await create({ backend: 'oracle' })).status, 422);
});
