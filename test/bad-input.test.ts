// Bad input never causes a 5xx and changes nothing: generated bad requests against every operation of
// the served OpenAPI document, each answered 4xx with `{ message }` and a store fingerprint left identical.
import t from 'tap';
import fc from 'fast-check';
import { createHash } from 'node:crypto';
import { startTestService } from './helpers/service.js';
import { until } from './helpers/until.js';
import { fillPath, type JsonSchema, type OpenApiDoc, type Operation } from './helpers/openapi.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { sha256Hex } from '../src/security/tokens.js';
import { soak } from './helpers/soak.js';

const SEED = Number(process.env.POOLGATE_FUZZ_SEED ?? 20261122);
// 1,200 cases in the soak run (test/soak/bad-input.test.ts), 300 in the default suite.
const RUNS = Number(process.env.POOLGATE_FUZZ_RUNS ?? soak(1200, 300));
/** Each operation gets at least this many cases (10 of 1,200). */
const PER_OPERATION = Math.max(1, Math.floor(RUNS / 120));
const TIME_LIMIT_MS = 55_000;

const svc = await startTestService();
t.teardown(() => svc.close());
const oracle = await svc.openapi();
const sql = svc.service.sql;
const markBeforeFixtures = await writeMark();

// ---- fixtures: one team with one of each resource, a second team, dead tokens -------------------------

const a = await svc.bootstrap({ team: 'Fuzz Owner', plan: 'business' });
const b = await svc.bootstrap({ team: 'Fuzz Foreign', plan: 'business' });
const pool = (
  await sql.query<{ id: number; subdomain: string }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host)
     VALUES ($1, 'fuzz-pool', 'fuzz-pool-a1', 'http', 'https://api.example.test', 'api.example.test') RETURNING id, subdomain`,
    [a.team.id],
  )
).rows[0]!;
const key = (
  await sql.query<{ id: number }>(
    `INSERT INTO pool_keys (pool_id, label, key_hash, last_four) VALUES ($1, 'fuzz', $2, 'zzzz') RETURNING id`,
    [pool.id, sha256Hex('pgk_fuzz_fixture')],
  )
).rows[0]!;
const webhook = (
  await sql.query<{ id: number }>(
    `INSERT INTO webhook_endpoints (team_id, name, url, signing_secret_enc) VALUES ($1, 'fuzz-hook', 'https://hooks.example.test/in', $2) RETURNING id`,
    [a.team.id, svc.service.box.seal('whsec_fixture')],
  )
).rows[0]!;
const budget = (
  await sql.query<{ id: number }>(`INSERT INTO budgets (team_id, name, origin_max_concurrent) VALUES ($1, 'fuzz-budget', 20) RETURNING id`, [a.team.id])
).rows[0]!;
await sql.query('INSERT INTO budget_pools (budget_id, pool_id, reserved_concurrent) VALUES ($1, $2, 5)', [budget.id, pool.id]);
const revoked = await svc.admin(['token', 'create', '--team', String(a.team.id), '--user', String(a.user.id)]);
await svc.admin(['token', 'revoke', '--team', String(a.team.id), '--id', String(revoked.id)]);
const expired = await svc.admin(['token', 'create', '--team', String(a.team.id), '--user', String(a.user.id)]);
await sql.query(`UPDATE api_tokens SET expires_at = now() - interval '1 minute' WHERE id = $1`, [expired.id]);

/** The value that addresses team A's fixture for each path parameter the document uses. */
const GOOD_PARAM: Record<string, string> = {
  pool: pool.subdomain,
  subdomain: pool.subdomain,
  budget: String(budget.id),
  apiKey: String(key.id),
  id: String(webhook.id),
  webhookEndpoint: String(webhook.id),
  token: `pgi_${'Q'.repeat(40)}`, // well formed, never minted
};
const goodParams = (op: Operation): Record<string, string> =>
  Object.fromEntries(op.pathParams.map((p) => [p.name, GOOD_PARAM[p.name] ?? (p.schema?.type === 'integer' ? '1' : 'fixture')]));

// ---- the store fingerprint: row count and content hash of every table ---------------------------------

async function fingerprint(): Promise<Record<string, string>> {
  const tables = (
    await sql.query<{ name: string }>(
      `SELECT table_name AS name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY 1`,
    )
  ).rows.map((r) => r.name);
  const parts = tables.map(
    (name) =>
      `SELECT '${name}' AS name, count(*)::int AS n, coalesce(md5(string_agg(r::text, E'\\n' ORDER BY r::text)), '') AS h FROM "${name}" r`,
  );
  const { rows } = await sql.query<{ name: string; n: number; h: string }>(parts.join(' UNION ALL '));
  return Object.fromEntries(rows.map((r) => [r.name, `${r.n}:${r.h}`]));
}

/**
 * One past the newest finished transaction id (the current snapshot's xmax). A transaction that changes a row
 * is given an id, so while this stays the same no write has committed and the fingerprint cannot have changed:
 * the per-request check hashes every table only when it moved (~30 ms of the store's CPU a hash, 300 requests).
 */
async function writeMark(): Promise<string> {
  return (await sql.query<{ x: string }>('SELECT pg_snapshot_xmax(pg_current_snapshot())::text AS x')).rows[0]!.x;
}

function diff(before: Record<string, string>, after: Record<string, string>): string[] {
  const names = new Set([...Object.keys(before), ...Object.keys(after)]);
  return [...names].filter((n) => before[n] !== after[n]).map((n) => `${n}: ${before[n]} → ${after[n]}`);
}

// ---- building blocks of bad input ----------------------------------------------------------------------

const components = (oracle.doc as OpenApiDoc).components?.schemas ?? {};
const deref = (s: JsonSchema): JsonSchema =>
  typeof s.$ref === 'string' ? deref(components[s.$ref.replace('#/components/schemas/', '')] ?? {}) : s;

/** A value shaped like the schema (required properties only): the carrier a single defect is put into. */
function skeleton(raw: JsonSchema): unknown {
  const s = deref(raw);
  if (s.anyOf) return skeleton(s.anyOf[0]);
  if (s.enum) return s.enum[0];
  if (s.const !== undefined) return s.const;
  switch (s.type) {
    case 'object':
      return Object.fromEntries((s.required ?? []).map((k: string) => [k, skeleton(s.properties?.[k] ?? {})]));
    case 'array':
      return [];
    case 'integer':
    case 'number':
      return s.minimum ?? 1;
    case 'boolean':
      return false;
    case 'string':
      return s.format === 'date-time' ? '2030-01-01T00:00:00Z' : 'x'.repeat(Math.max(1, s.minLength ?? 1));
    default:
      return null;
  }
}

/** Top-level property names of a body schema, by the JSON type they hold. */
function propsOf(op: Operation): Array<{ name: string; schema: JsonSchema }> {
  const s = deref(op.bodySchema ?? {});
  return Object.entries((s.properties ?? {}) as Record<string, JsonSchema>).map(([name, schema]) => ({ name, schema: deref(schema) }));
}

function hasNulOrLoneSurrogate(v: unknown): boolean {
  if (typeof v === 'string') return /\u0000|\p{Cs}/u.test(v);
  if (v && typeof v === 'object') return Object.entries(v).some(([k, x]) => hasNulOrLoneSurrogate(k) || hasNulOrLoneSurrogate(x));
  return false;
}
/** What the schema accepts is not bad input; wrapping it in an array makes any object body invalid. */
function ensureInvalid(op: Operation, body: unknown): unknown {
  if (oracle.bodyErrors(op, body) !== null) return body;
  if (hasNulOrLoneSurrogate(body)) return body; // text that no store column can hold: the API must refuse it
  return [body];
}

const ODD_STRINGS = [
  '\ud800', 'a\udfffb', '\udc00\ud800', '\u0000', 'x\u0000y', '\u202egnp.exe', '\u200f\u202bשלום', '🦄'.repeat(200),
  'e\u0301\u0301\u0301', '\ufeff', '\uffff\ufffe', 'ǅ\u0130\u0131', '../../etc/passwd', '%00', '${jndi:ldap://x}',
  "'; DROP TABLE pools; --", '\r\nX-Injected: 1', '𝕏'.repeat(5000), 'a'.repeat(20_000), '',
];
const oddString = fc.oneof(
  fc.constantFrom(...ODD_STRINGS),
  fc.string({ unit: 'binary', minLength: 1, maxLength: 40 }),
  fc.string({ unit: 'grapheme', minLength: 61, maxLength: 120 }),
);
const ODD_NUMBERS = [1e308, -1, 0, -0, 0.5, 1.5, -2.5, 2 ** 31, 2 ** 53 + 2, -(2 ** 53), 1e-300, 65536, 4294967296];
const wrongType = fc.oneof(
  fc.integer(),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.boolean(),
  fc.constant(null),
  fc.array(fc.jsonValue({ maxDepth: 2 }), { maxLength: 3 }),
  fc.dictionary(fc.string({ maxLength: 5 }), fc.jsonValue({ maxDepth: 1 }), { maxKeys: 3 }),
  oddString,
);
const MALFORMED_JSON = [
  '{', '}', '{"a":', '{"a" 1}', "{'a':1}", '[1,]', '{"a":1,}', 'nul', 'tru', 'NaN', '{"a":NaN}', '{"a":Infinity}',
  '{"a":"\\x41"}', '{"a":"\\ud8"}', '{"a":"unterminated}', '\u0000', '{}{}', '{} x', '{"__proto__":', '0x10',
  '{"a":1e}', '{"a":01}', '{"a":--1}', '{"a":[1,2}', '/* c */ {}', '{"a":1} // c',
];
const BAD_CONTENT_TYPES = [
  'text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', 'application/xml',
  'text/json', 'application/jsonx', 'application/javascript', 'image/png', 'application/octet-stream', '*/*', 'json',
];
const BAD_AUTH = (): Array<Record<string, string>> => [
  {},
  { authorization: '' },
  { authorization: 'Bearer' },
  { authorization: 'Bearer ' },
  { authorization: `Bearer pgt_${'0'.repeat(40)}` },
  { authorization: `Basic ${Buffer.from('owner:pw').toString('base64')}` },
  { authorization: `Token ${a.token}` },
  { authorization: `Bearer ${a.token}x` },
  { authorization: `Bearer ${a.token} ${a.token}` },
  { authorization: `Bearer ${a.token.slice(0, -1)}` },
  { authorization: `Bearer ${revoked.token}` },
  { authorization: `Bearer ${expired.token}` },
  { authorization: `Bearer ${'A'.repeat(8000)}` },
  { authorization: `Bearer ${'A'.repeat(20_000)}` }, // beyond Node's header limit: refused by the HTTP parser
  { authorization: 'Bearer ../../../etc/passwd' },
  { authorization: 'Bearer %00' },
  { 'x-service-key': 'pgk_fuzz_fixture' },
];
/** Path segments that address nothing: none coerces to a fixture id or names a fixture. */
const BAD_SEGMENTS = [
  'abc', '-1', '0', '-0', '1.5', '99999999999999999999999', '2147483648', '1e400', '0x7fffffffffff', 'NaN', 'Infinity',
  'null', 'undefined', '%5B%5D', '%00', '%2e%2e', '..', '..%2f..%2fme', '%2e%2e%2f%2e%2e%2fme', '%ff%fe', '%', '%zz',
  encodeURIComponent('١٢٣'), encodeURIComponent('🦄'), encodeURIComponent('\u202e7'),
  'a'.repeat(300), 'ZZ-UPPER', 'no-such-pool-zz', '-bad-', 'a_b', '%20', '+0', encodeURIComponent("' OR 1=1 --"),
  encodeURIComponent(`${pool.subdomain}\u0000`), `${pool.subdomain}%2f..`, `${pool.subdomain}.`, `${pool.subdomain}-`,
];
const randomSegment = fc.string({ unit: 'binary', minLength: 1, maxLength: 30 }).map((s) => `zz${encodeURIComponent(s.replace(/[\ud800-\udfff]/g, 'x'))}`);
const BAD_DATE_TIMES = ['yesterday', '2024-13-01T00:00:00Z', '2024-02-30T00:00:00Z', '1700000000', '2024-01-01', '', 'T', '9999999-01-01T00:00:00Z', '2024-01-01T25:00:00Z', '2024-01-01 00:00:00', '\u0000'];

interface BadRequest {
  op: string;
  kind: string;
  method: string;
  path: string;
  headers: Record<string, string>;
  rawBody?: string;
}

const JSON_HEADERS = { 'content-type': 'application/json' };

function requestFor(op: Operation, kind: string, parts: { params?: Record<string, string>; query?: string; headers?: Record<string, string>; rawBody?: string; token?: string | null }): BadRequest {
  const token = parts.token === undefined ? a.token : parts.token;
  const path = fillPath(op.path, { ...goodParams(op), ...parts.params }) + (parts.query ?? '');
  const headers: Record<string, string> = { ...(token ? { authorization: `Bearer ${token}` } : {}), ...parts.headers };
  let rawBody = parts.rawBody;
  // Every non-GET carries a body unless the defect is elsewhere and the operation takes none.
  if (rawBody === undefined && op.bodySchema && op.method !== 'GET') {
    rawBody = JSON.stringify(skeleton(op.bodySchema));
    headers['content-type'] ??= 'application/json';
  }
  return { op: `${op.method} ${op.path}`, kind, method: op.method, path, headers, rawBody };
}

/** The defects that apply to one operation, each an arbitrary of bad requests. */
function defectsOf(op: Operation): Array<fc.Arbitrary<BadRequest>> {
  const out: Array<fc.Arbitrary<BadRequest>> = [];
  const takesBody = op.method !== 'GET' && op.method !== 'HEAD';
  const auth = fc.constantFrom(...BAD_AUTH()).map((h) => requestFor(op, 'auth', { token: null, headers: h }));
  if (op.pathParams.length > 0) {
    out.push(
      fc
        .record({ param: fc.constantFrom(...op.pathParams.map((p) => p.name)), value: fc.oneof(fc.constantFrom(...BAD_SEGMENTS), randomSegment) })
        .map(({ param, value }) => requestFor(op, 'path-id', { params: { [param]: value } })),
    );
    out.push(fc.constant(requestFor(op, 'foreign-team', { token: b.token })));
  }
  for (const q of op.queryParams) {
    const bad = deref(q.schema ?? {}).format === 'date-time' ? fc.constantFrom(...BAD_DATE_TIMES) : fc.constantFrom('abc', '-1', '1.5', '1e400', '');
    out.push(bad.map((v) => requestFor(op, 'query', { query: `?${encodeURIComponent(q.name)}=${encodeURIComponent(v)}` })));
  }
  if (takesBody) {
    const carrier = op.bodySchema ? JSON.stringify(skeleton(op.bodySchema)) : '{}';
    out.push(
      fc
        .oneof(
          fc.constantFrom(...MALFORMED_JSON),
          fc.integer({ min: 1, max: Math.max(1, carrier.length - 1) }).map((n) => carrier.slice(0, n)),
        )
        .filter((text) => {
          try {
            JSON.parse(text.trim());
            return text.trim() === '';
          } catch {
            return true;
          }
        })
        .map((text) => requestFor(op, 'malformed-json', { rawBody: text, headers: JSON_HEADERS })),
    );
    out.push(
      fc
        .record({ type: fc.constantFrom(...BAD_CONTENT_TYPES, null), body: fc.constantFrom(carrier, 'a=1&b=2', '<x/>') })
        .map(({ type, body }) => requestFor(op, 'content-type', { rawBody: body, headers: type === null ? {} : { 'content-type': type } })),
    );
    out.push(
      fc
        .constantFrom('{"name":"', '{"', '[')
        .map((open) => requestFor(op, 'oversized', { rawBody: `${open}${'a'.repeat(svc.config.controlBodyLimit + 1)}`, headers: JSON_HEADERS })),
    );
  }
  if (takesBody && op.bodySchema) {
    const props = propsOf(op);
    const base = skeleton(op.bodySchema) as Record<string, unknown>;
    const withBody = (kind: string) => (body: unknown) => requestFor(op, kind, { rawBody: JSON.stringify(ensureInvalid(op, body)), headers: JSON_HEADERS });
    out.push(wrongType.filter((v) => typeof v !== 'object' || v === null || Array.isArray(v)).map(withBody('wrong-type-body')));
    if (props.length > 0) {
      const prop = fc.constantFrom(...props);
      out.push(fc.record({ p: prop, v: wrongType }).map(({ p, v }) => ({ ...base, [p.name]: v })).map(withBody('wrong-type-property')));
      out.push(fc.record({ p: prop, v: fc.constantFrom(...ODD_NUMBERS) }).map(({ p, v }) => ({ ...base, [p.name]: v })).map(withBody('odd-number')));
      out.push(fc.record({ p: prop, v: oddString }).map(({ p, v }) => ({ ...base, [p.name]: v })).map(withBody('odd-unicode')));
    }
    out.push(
      fc
        .record({ k: fc.oneof(fc.constantFrom('unknown', 'id', 'team_id', 'constructor', 'prototype', '__proto__', 'is_admin'), fc.string({ minLength: 1, maxLength: 8 })), v: fc.jsonValue({ maxDepth: 1 }) })
        .filter(({ k }) => !Object.hasOwn(deref(op.bodySchema ?? {}).properties ?? {}, k))
        .map(({ k, v }) => ({ ...base, [k]: v }))
        .map(withBody('unknown-property')),
    );
    // Raw number literals JSON.stringify never writes: overflow to Infinity, beyond 2^53, negative zero.
    const numeric = props.filter((p) => [p.schema.type, ...(p.schema.anyOf ?? []).map((s: JsonSchema) => deref(s).type)].some((ty) => ty === 'integer' || ty === 'number'));
    if (numeric.length > 0) {
      out.push(
        fc
          .record({ p: fc.constantFrom(...numeric), lit: fc.constantFrom('1e400', '-1e400', '123456789012345678901234567890', '-0', '0.0000001', '1.0e1', '9007199254740993') })
          .map(({ p, lit }) => {
            const marker = '"__LITERAL__"';
            const text = JSON.stringify({ ...base, [p.name]: '__LITERAL__' }).replace(marker, lit);
            const parsed = JSON.parse(text) as unknown;
            // Values the schema accepts once parsed (e.g. 1.0e1 = 10) are valid input: wrap them as above.
            return requestFor(op, 'raw-number', { rawBody: oracle.bodyErrors(op, parsed) === null ? `[${text}]` : text, headers: JSON_HEADERS });
          }),
      );
    }
  }
  // Auth applies to every operation; weight it so the defects specific to an operation get most requests.
  return [auth, ...out.flatMap((x) => [x, x])];
}

const operations = oracle.operations;
const arbitraries = operations.map((op) => fc.oneof(...defectsOf(op)));
const badRequest = fc.nat({ max: operations.length - 1 }).chain((i) => arbitraries[i]!);

t.test(`${RUNS} generated bad requests across every operation get a 4xx Error and change nothing (seed ${SEED})`, async (t) => {
  t.ok(operations.length >= 4, `the document lists ${operations.length} operations`);
  const notified: string[] = [];
  const unlisten = await sql.listen(CHANGE_CHANNEL, (p) => notified.push(p));
  const perOperation = new Map<string, number>();
  const perKind = new Map<string, number>();
  const statuses = new Map<number, number>();
  let sent = 0;
  // The mark is read before the hash it stands for: a write in between moves it, and the next check hashes again.
  let mark = await writeMark();
  if (mark === markBeforeFixtures) throw new Error(`writing the fixtures left the write mark at ${mark}: it cannot stand for the fingerprint`);
  let before = await fingerprint();
  let hashed = 0;
  const started = Date.now();

  await fc.assert(
    fc.asyncProperty(badRequest, async (req) => {
      const where = `${req.kind} ${req.method} ${req.path.slice(0, 200)} headers=${JSON.stringify(req.headers).slice(0, 200)} body=${JSON.stringify(req.rawBody?.slice(0, 200))}`;
      const res = await svc.api(req.method as 'GET', req.path, { token: null, headers: req.headers, rawBody: req.rawBody });
      sent++;
      perOperation.set(req.op, (perOperation.get(req.op) ?? 0) + 1);
      perKind.set(req.kind, (perKind.get(req.kind) ?? 0) + 1);
      statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
      if (res.status < 400 || res.status > 499) throw new Error(`${where}: status ${res.status}, body ${JSON.stringify(res.body).slice(0, 300)}`);
      if (typeof res.body?.message !== 'string') throw new Error(`${where}: body is not { message }: ${JSON.stringify(res.body).slice(0, 300)}`);
      const now = await writeMark();
      if (now === mark) return; // nothing committed since `before` was taken
      mark = now;
      hashed++;
      const after = await fingerprint();
      const changed = diff(before, after);
      before = after;
      if (changed.length > 0) {
        // Show the newest rows of each changed table: the write usually names the request that made it.
        const rows = [];
        for (const line of changed) {
          const table = line.slice(0, line.indexOf(':'));
          rows.push(`${table}: ${JSON.stringify((await sql.query(`SELECT * FROM "${table}" ORDER BY 1 DESC LIMIT 2`)).rows).slice(0, 600)}`);
        }
        throw new Error(`${where}: the store changed: ${changed.join('; ')}; newest rows: ${rows.join('; ')}`);
      }
    }),
    { seed: SEED, numRuns: RUNS, interruptAfterTimeLimit: TIME_LIMIT_MS, markInterruptAsFailure: true, endOnFailure: true },
  );

  // A notification of our own, published after every request was answered, arrives after any the service
  // published for them (the store delivers them in commit order): once it is here, nothing stray is on its way.
  const witness = `test-witness:${Math.random()}`;
  await sql.notify(CHANGE_CHANNEL, witness);
  await until('our own notification', () => notified.includes(witness));
  await unlisten();
  t.ok(sent >= Math.ceil((RUNS * 5) / 6), `sent ${sent} bad requests in ${Date.now() - started} ms`);
  t.same(notified.filter((n) => n !== witness), [], 'no change notification was published');
  for (const op of operations) t.ok((perOperation.get(`${op.method} ${op.path}`) ?? 0) >= PER_OPERATION, `${op.method} ${op.path}: ${perOperation.get(`${op.method} ${op.path}`) ?? 0} bad requests`);
  t.comment(`by defect: ${JSON.stringify(Object.fromEntries(perKind))}; the store was hashed again after ${hashed} of them`);
  t.comment(`by status: ${JSON.stringify(Object.fromEntries([...statuses].sort()))}`);
  t.comment(`store fingerprint ${createHash('sha256').update(JSON.stringify(before)).digest('hex').slice(0, 16)}`);
});
