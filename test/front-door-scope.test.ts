// Issue 15 items 6 and 7, through the proxy port with raw sockets (no client library tidies the path) and an
// origin that records what reaches it: a path-scoped read key cannot walk out of its prefix by encoding,
// dot segments, `\`, `;`, double encoding or a look-alike prefix, and a method-override header is judged as
// the method it names.
import t from 'tap';
import { connect } from 'node:net';
import { startTestService, type TestService } from './helpers/service.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { canonicalPath, underPrefix } from '../src/dataplane/scoped-path.js';

let origin: Origin;
let svc: TestService;
let readKey = '';
let writeKey = '';

t.before(async () => {
  origin = await startOrigin();
  svc = await startTestService({ overrides: { originCaFile: origin.caFile } });
  const boot = await svc.bootstrap();
  const sql = svc.service.sql;
  const settings = { readMethods: ['POST', 'DELETE'], readPaths: { POST: ['/search'], DELETE: ['/cache/'] } };
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, 'scoped', 'scoped', 'http', $2, $3, 4, true, $4::jsonb) RETURNING id`,
    [boot.team.id, origin.url, new URL(origin.url).host, JSON.stringify(settings)],
  );
  await sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  const mint = async (access: string) => {
    const r = await svc.api('POST', '/api/v1/pools/scoped/keys', { token: boot.token, body: { access } });
    return r.body.data.key as string;
  };
  readKey = await mint('read');
  writeKey = await mint('write');
  await svc.service.dataplane!.snapshots.reload();
});
t.teardown(async () => {
  await svc?.close();
  await origin?.close();
});

/** One request written as is; resolves with the status once the response (a JSON body with a length) is in. */
function raw(method: string, target: string, key: string, extra = ''): Promise<number> {
  const text = `${method} ${target} HTTP/1.1\r\nHost: scoped.pools.localhost\r\nX-Service-Key: ${key}\r\n${extra}Content-Length: 2\r\n\r\n{}`;
  return new Promise((resolve, reject) => {
    const sock = connect(svc.service.ports.proxy!, '127.0.0.1', () => sock.write(text));
    let got = '';
    sock.on('data', (c: Buffer) => {
      got += c.toString('latin1');
      const head = got.indexOf('\r\n\r\n');
      const len = /content-length: (\d+)/i.exec(got);
      if (head !== -1 && len && got.length - head - 4 >= Number(len[1])) sock.destroy();
    });
    sock.on('close', () => resolve(Number(/^HTTP\/1\.1 (\d{3})/.exec(got)?.[1] ?? 0)));
    sock.on('error', reject);
  });
}

t.test('canonicalPath: RFC 3986 normalization, merged slashes, and refusal of decoder-dependent escapes', async (t) => {
  const cases: Array<[string, string | null]> = [
    ['/search', '/search'],
    ['/s%65arch/%7Eme', '/search/~me'],
    ['/search/a/../b', '/search/b'],
    ['/search/./x', '/search/x'],
    ['/search//x///y', '/search/x/y'],
    ['/search/..', '/'],
    ['/search/../admin', '/admin'],
    ['/search/%2e%2E/admin', '/admin'],
    ['/search/a%20b', '/search/a%20b'],
    ['/search/a%c3%a9', '/search/a%C3%A9'],
    ['/search/..%2fadmin', null],
    ['/search%2F..%2Fadmin', null],
    ['/search/..%5cadmin', null],
    ['/search/..\\admin', null],
    ['/search/..;/admin', null],
    ['/search/%252e%252e/admin', null],
    ['/search/%zz', null],
    ['/search/%2', null],
    ['/search/%00', null],
    ['search', null],
  ];
  for (const [input, want] of cases) t.equal(canonicalPath(input), want, input);
  t.ok(underPrefix('/search', '/search'));
  t.ok(underPrefix('/search/x', '/search'));
  t.notOk(underPrefix('/search-admin', '/search'), 'a prefix matches on a segment boundary');
  t.notOk(underPrefix('/searchx', '/search'));
  t.ok(underPrefix('/cache/x', '/cache/'));
  t.notOk(underPrefix('/cache', '/cache/'));
});

t.test('a path-scoped read key is refused every escape from its prefix, and the origin sees none of them', async (t) => {
  const bypasses = [
    '/search/..%2fadmin',
    '/search%2f..%2fadmin',
    '/search/..%5cadmin',
    '/search/..\\admin',
    '/search/..;/admin',
    '/search;/../admin',
    '/search/%252e%252e/admin',
    '/search-admin',
    '/searchadmin',
    '/search/../admin',
    '/search/%2e%2e/admin',
    '/search/./../admin',
    '//admin',
    '/SEARCH',
  ];
  origin.reset();
  for (const path of bypasses) t.equal(await raw('POST', path, readKey), 403, `POST ${path}`);
  t.equal(origin.count, 0, 'nothing reached the origin');

  origin.reset();
  t.equal(await raw('POST', '/search', readKey), 200);
  t.equal(await raw('POST', '/search/q?x=%2F', readKey), 200, 'the query is not the path');
  t.equal(await raw('POST', '/s%65arch//a/./b/../c', readKey), 200, 'a non-canonical path inside the prefix is admitted');
  t.same(origin.requests.map((r) => r.url), ['/search', '/search/q?x=%2F', '/search/a/c'], 'the origin gets the canonical path that was judged');

  origin.reset();
  t.equal(await raw('POST', '/search/..%2fadmin', writeKey), 200, 'a write key is not path-scoped: its path is forwarded as sent');
  t.same(origin.requests.map((r) => r.url), ['/search/..%2fadmin']);
});

t.test('a method-override header is judged as the method it names', async (t) => {
  origin.reset();
  for (const name of ['X-HTTP-Method-Override', 'X-HTTP-Method', 'X-Method-Override', 'x-http-method-override']) {
    t.equal(await raw('GET', '/x', readKey, `${name}: PUT\r\n`), 403, `GET with ${name}: PUT`);
    t.equal(await raw('GET', '/x', readKey, `${name}: delete\r\n`), 403, `GET /x with ${name}: delete (DELETE is scoped to /cache/)`);
    t.equal(await raw('GET', '/x', readKey, `${name}: GET\r\n${name}: PATCH\r\n`), 403, `repeated ${name}`);
  }
  t.equal(await raw('GET', '/search-admin', readKey, 'X-HTTP-Method-Override: POST\r\n'), 403, 'the overridden method meets its path scope');
  t.equal(origin.count, 0, 'the origin saw none of them');
  t.equal(await raw('GET', '/cache/a', readKey, 'X-HTTP-Method-Override: DELETE\r\n'), 200, 'an override the key admits passes');
  t.equal(await raw('GET', '/x', readKey, 'X-HTTP-Method-Override: HEAD\r\n'), 200);
  t.equal(await raw('GET', '/x', writeKey, 'X-HTTP-Method-Override: PUT\r\n'), 200, 'a write key may override to any method');
  t.equal(origin.count, 3);
});
