// The headers a forwarded request carries to the origin (spec: hop-by-hop dropped, pool auth never forwarded,
// X-Forwarded-* set by poolgate, the managed credential injected). They go to undici flat (name, value, …): each
// name must appear once, and an injected credential replaces whatever the client sent under that name.
import t from 'tap';
import { upstreamRequestHeaders, type UpstreamHeaderInput } from '../src/pool-request/headers.js';

const input = (over: Partial<UpstreamHeaderInput>): UpstreamHeaderInput => ({
  headers: {},
  originHost: 'origin.test',
  clientAddress: '203.0.113.7',
  trustForwarded: false,
  clientHost: 'p.pools.test',
  keyInAuthorization: false,
  credential: null,
  ...over,
});

/** The flat list as pairs, and each name's values. */
function byName(flat: string[]): Map<string, string[]> {
  const m = new Map<string, string[]>();
  for (let i = 0; i < flat.length; i += 2) m.set(flat[i]!, [...(m.get(flat[i]!) ?? []), flat[i + 1]!]);
  return m;
}

t.test('client headers pass on; hop-by-hop, pool auth and forged forwarding headers do not', async (t) => {
  const out = byName(
    upstreamRequestHeaders(
      input({
        headers: {
          host: 'p.pools.test',
          accept: 'application/json',
          connection: 'keep-alive, x-drop-me',
          'x-drop-me': '1',
          'keep-alive': 'timeout=5',
          'x-service-key': 'pgk_secret',
          'x-forwarded-for': '10.0.0.1',
          'proxy-authorization': 'x',
        },
      }),
    ),
  );
  t.same(out.get('accept'), ['application/json']);
  t.same(out.get('host'), ['origin.test'], 'the origin gets its own Host, once');
  t.same(out.get('x-forwarded-for'), ['203.0.113.7'], 'a client cannot forge the chain');
  t.same(out.get('x-forwarded-host'), ['p.pools.test']);
  t.same(out.get('x-forwarded-proto'), ['http']);
  for (const gone of ['connection', 'x-drop-me', 'keep-alive', 'x-service-key', 'proxy-authorization']) t.notOk(out.has(gone), `${gone} is not forwarded`);
});

t.test('a trusted proxy extends the chain', async (t) => {
  const out = byName(upstreamRequestHeaders(input({ trustForwarded: true, headers: { 'x-forwarded-for': '198.51.100.1', 'x-forwarded-proto': 'https' } })));
  t.same(out.get('x-forwarded-for'), ['198.51.100.1, 203.0.113.7']);
  t.same(out.get('x-forwarded-proto'), ['https']);
});

t.test('an injected credential replaces the header the client sent under its name', async (t) => {
  const apiKey = byName(upstreamRequestHeaders(input({ headers: { 'x-api-key': 'client-chosen' }, credential: { method: 'api_key', api_key: 'managed', header_name: 'X-Api-Key' } })));
  t.same(apiKey.get('x-api-key'), ['managed']);
  const bearer = byName(upstreamRequestHeaders(input({ headers: { authorization: 'Bearer client' }, credential: { method: 'bearer_static', token: 'managed' } })));
  t.same(bearer.get('authorization'), ['Bearer managed']);
  const basic = byName(upstreamRequestHeaders(input({ headers: { authorization: 'Basic x' }, credential: { method: 'basic', username: 'u', password: 'p' } })));
  t.same(basic.get('authorization'), [`Basic ${Buffer.from('u:p').toString('base64')}`]);
});

t.test('the pool key in Authorization is pool auth, not the origin\'s', async (t) => {
  const out = byName(upstreamRequestHeaders(input({ headers: { authorization: 'Bearer pgk_secret' }, keyInAuthorization: true })));
  t.notOk(out.has('authorization'));
  const open = byName(upstreamRequestHeaders(input({ headers: { authorization: 'Bearer origin-token' } })));
  t.same(open.get('authorization'), ['Bearer origin-token'], "an origin's own Authorization passes through");
});

t.test('a credential named like a forwarding header replaces poolgate\'s own: each name once', async (t) => {
  const flat = upstreamRequestHeaders(input({ credential: { method: 'api_key', api_key: 'managed', header_name: 'X-Forwarded-Host' } }));
  const out = byName(flat);
  t.same(out.get('x-forwarded-host'), ['managed'], 'the credential, once');
  t.same(out.get('x-forwarded-for'), ['203.0.113.7']);
  t.equal(new Set(flat.filter((_, i) => i % 2 === 0)).size, flat.length / 2, 'no name twice');
});
