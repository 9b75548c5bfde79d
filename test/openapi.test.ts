// The served OpenAPI document: a valid OpenAPI 3.1.0 description, version 1.0.0, of every /api/v1 operation
// (spec: Versioning 1–2), and the response checker every other test relies on.
import t from 'tap';
import { Validator } from '@seriousme/openapi-schema-validator';
import { startTestApi } from './helpers/service.js';
import { API_PREFIX, HTTP_METHODS, OpenApiOracle, type OpenApiDoc } from './helpers/openapi.js';
import { SchemaCompilers } from '../src/control/schema-compilers.js';

const svc = await startTestApi();
t.teardown(() => svc.close());

/** Every `$ref` string in the document, with where it sits. */
function collectRefs(node: unknown, at: string, out: Array<{ ref: string; at: string }>): void {
  if (Array.isArray(node)) node.forEach((v, i) => collectRefs(v, `${at}/${i}`, out));
  else if (node && typeof node === 'object') {
    for (const [k, v] of Object.entries(node)) {
      if (k === '$ref' && typeof v === 'string') out.push({ ref: v, at });
      else collectRefs(v, `${at}/${k}`, out);
    }
  }
}

function resolvePointer(doc: unknown, ref: string): unknown {
  let cur: unknown = doc;
  for (const raw of ref.slice(2).split('/')) {
    const key = raw.replaceAll('~1', '/').replaceAll('~0', '~');
    if (!cur || typeof cur !== 'object' || !(key in cur)) return undefined;
    cur = (cur as Record<string, unknown>)[key];
  }
  return cur;
}

const res = await svc.app.inject({ method: 'GET', url: '/api/v1/openapi.json' });
const doc = res.json() as OpenApiDoc;

t.test('the document is served without a token, as JSON', async (t) => {
  t.equal(res.statusCode, 200);
  t.match(String(res.headers['content-type']), /^application\/json/);
});

t.test('it is OpenAPI 3.1.0, API description version 1.0.0, and a real validator accepts it', async (t) => {
  t.equal(doc.openapi, '3.1.0');
  t.equal(doc.info.version, '1.0.0');
  t.type(doc.info.title, 'string');
  const validator = new Validator();
  const verdict = await validator.validate(structuredClone(doc) as Record<string, unknown>);
  t.ok(verdict.valid, `validator errors: ${JSON.stringify(verdict.errors, null, 1)}`);
  t.equal(validator.version, '3.1');
  // The validator is not a rubber stamp: an operation without `responses` content rules is refused.
  const broken = structuredClone(doc) as any;
  broken.paths['/api/v1/me'].get.responses = { 200: { content: 'not a map' } };
  t.notOk((await new Validator().validate(broken)).valid, 'a broken copy is refused');
});

t.test('every $ref points inside the document, at an existing component', async (t) => {
  const refs: Array<{ ref: string; at: string }> = [];
  collectRefs(doc, '#', refs);
  t.ok(refs.length > 0, 'shared schemas are referenced, not inlined');
  for (const { ref, at } of refs) {
    t.match(ref, /^#\/components\/schemas\/[A-Za-z0-9._-]+$/, `${at}: ${ref} is a local component ref`);
    t.not(resolvePointer(doc, ref), undefined, `${at}: ${ref} resolves`);
  }
});

t.test('every path carries the /api/v1 prefix and every template parameter is declared', async (t) => {
  const paths = Object.keys(doc.paths);
  t.ok(paths.length >= 4, `the document lists the Control API (${paths.length} paths)`);
  for (const path of paths) {
    t.ok(path.startsWith(`${API_PREFIX}/`), `${path} starts with ${API_PREFIX}/`);
    t.notMatch(path, /:\w/, `${path} uses {name} templates, not :name`);
    for (const method of HTTP_METHODS) {
      const op = doc.paths[path]![method];
      if (!op) continue;
      const declared = new Set((op.parameters ?? []).filter((p) => p.in === 'path' && p.required).map((p) => p.name));
      for (const [, name] of path.matchAll(/\{([^}]+)\}/g)) t.ok(declared.has(name!), `${method.toUpperCase()} ${path} declares required path parameter ${name}`);
    }
  }
});

t.test('every operation declares its responses: a JSON success body, Error bodies for failures, 404 when it addresses a resource', async (t) => {
  const oracle = await svc.openapi();
  t.ok(oracle.operations.length >= 4);
  for (const op of oracle.operations) {
    const where = `${op.method} ${op.path}`;
    const responses = op.op.responses ?? {};
    const statuses = Object.keys(responses);
    t.ok(statuses.some((s) => /^2/.test(s)), `${where} declares a 2xx response (has ${statuses.join(', ')})`);
    for (const [status, r] of Object.entries(responses)) {
      t.type(r.description, 'string', `${where} ${status} has a description`);
      if (status === '204') continue;
      const schema = r.content?.['application/json']?.schema;
      t.ok(schema, `${where} ${status} declares an application/json schema`);
      if (/^[45]/.test(status)) t.same(schema, { $ref: '#/components/schemas/Error' }, `${where} ${status} is the Error body`);
    }
    if (op.pathParams.length > 0) t.ok(responses['404'], `${where} declares 404 (unknown or foreign resource)`);
  }
});

t.test('every route the Control API serves is in the document (only the document itself, the dashboard\'s pages and the health probes are hidden)', async (t) => {
  // fastify's route tree, e.g. `│   └── /:budget (GET, HEAD)`: depth from the indent, path from the parents.
  const tree = svc.app.printRoutes({ commonPrefix: false });
  const stack: string[] = [];
  const served: string[] = [];
  for (const line of tree.split('\n')) {
    const m = /^([│ ]*)[├└]── (\S+) \(([^)]+)\)/.exec(line);
    if (!m) continue;
    const depth = m[1]!.length / 4;
    stack.length = depth;
    stack.push(m[2]!);
    const path = stack.join('').replace(/:(\w+)/g, '{$1}');
    for (const method of m[3]!.split(', ')) if (method !== 'HEAD') served.push(`${method} ${path}`);
  }
  t.ok(served.includes('GET /api/v1/me'), 'the route tree was read');
  const documented = new Set((await svc.openapi()).operations.map((o) => `${o.method} ${o.path}`));
  // The dashboard's HTML pages and assets (/dashboard…) and the health probes (docs/operations.md) are not API operations.
  const probes = ['GET /livez', 'GET /readyz', 'GET /healthz'];
  const missing = served.filter((r) => !documented.has(r) && r !== 'GET /api/v1/openapi.json' && !/^GET \/dashboard(\/|\*|$)/.test(r) && !probes.includes(r));
  t.same(missing, [], 'no served route is missing from the document');
  t.same([...documented].filter((r) => !served.includes(r)), [], 'no documented operation is unserved');
});

t.test('the Error schema is `{ message: string }`', async (t) => {
  t.same(doc.components?.schemas?.Error, {
    type: 'object',
    additionalProperties: false,
    required: ['message'],
    properties: { message: { type: 'string' } },
  });
});

t.test('the response checker catches a body that breaks the document, naming route, status and the ajv error', async (t) => {
  const oracle = await svc.openapi();
  t.equal(oracle.checkResponse('GET', '/api/v1/me', 200, 'application/json', { user: { id: 1, name: 'a', email: 'a@b.test' }, team: { id: 1, name: 'x', slug: 'x' }, abilities: [] }, '{}'), null);
  const wrongType = oracle.checkResponse('GET', '/api/v1/me', 200, 'application/json', { user: { id: 'one', name: 'a', email: 'a@b.test' }, team: { id: 1, name: 'x', slug: 'x' }, abilities: [] }, '{}');
  t.match(wrongType, /GET \/api\/v1\/me → 200: .*must be integer/);
  t.match(oracle.checkResponse('GET', '/api/v1/budgets/7', 404, 'application/json', { error: 'nope' }, '{}'), /GET \/api\/v1\/budgets\/\{budget\} → 404: .*message/);
  t.match(oracle.checkResponse('GET', '/api/v1/budgets', 418, 'text/plain', 'teapot', 'teapot'), /expected a JSON body/, 'undeclared 4xx still needs the Error body');
  t.match(oracle.checkResponse('GET', '/api/v1/budgets', 202, 'application/json', {}, '{}'), /not declared/, 'an undeclared success status is a documentation gap');
  t.equal(oracle.checkResponse('GET', '/api/v1/nowhere', 404, 'application/json', { message: 'route not found' }, '{}'), null);
  t.equal(oracle.checkResponse('GET', '/metrics', 200, 'text/plain', 'x', 'x'), null, 'non-Control-API paths are not checked');
  const synthetic = new OpenApiOracle({
    openapi: '3.1.0',
    info: { title: 't', version: '1.0.0' },
    paths: { '/api/v1/pools/{pool}': { post: {} }, '/api/v1/pools/database': { post: {} } },
  });
  t.equal(synthetic.match('POST', '/api/v1/pools/database?x=1')?.path, '/api/v1/pools/database', 'a static route wins, as in fastify');
  t.equal(synthetic.match('POST', '/api/v1/pools/abc')?.path, '/api/v1/pools/{pool}');
  t.equal(synthetic.match('POST', '/api/v1/pools/abc/def'), null);
});

t.test('api() rejects a response that breaks the document (the suite-wide check is wired in)', async (t) => {
  const oracle = await svc.openapi();
  const boot = await svc.bootstrap();
  const good = await svc.api('GET', '/api/v1/me', { token: boot.token });
  t.equal(good.status, 200);
  t.equal(oracle.checkResponse('GET', '/api/v1/me', good.status, String(good.headers['content-type']), good.body, JSON.stringify(good.body)), null);
  const unauth = await svc.api('GET', '/api/v1/budgets', { token: null });
  t.equal(unauth.status, 401, 'an undeclared 401 with an Error body passes');
});

t.test('an optional request body is documented as not required (POST …/keys), a mandatory one as required', async (t) => {
  const svc = await startTestApi();
  t.teardown(() => svc.close());
  const doc = (await svc.api('GET', '/api/v1/openapi.json')).body;
  t.equal(doc.paths['/api/v1/pools/{pool}/keys'].post.requestBody.required, false);
  t.equal(doc.paths['/api/v1/pools'].post.requestBody.required, true);
});

t.test('every route\'s request and response schemas compile (the service compiles each at its route\'s first request)', async (t) => {
  // What this file's requests have not compiled yet is compiled now.
  t.doesNotThrow(() => svc.app.schemaCompilers.compileAll(), 'every validator and serializer compiles');
  // A request after compileAll is answered by the compiled functions: a bad body is refused with ajv's reason.
  const boot = await svc.bootstrap();
  const bad = await svc.api('POST', '/api/v1/pools', { token: boot.token, body: { origin: 'https://api.example.com', extra: true } });
  t.equal(bad.status, 422);
  t.match(bad.body.message, /unknown property "extra"/);
  const good = await svc.api('POST', '/api/v1/pools', { token: boot.token, body: { origin: 'https://api.example.com' } });
  t.equal(good.status, 201, 'and a good one is served through the compiled serializer (api() checks it against the document)');
});

t.test('compileAll refuses a schema the JSON Schema meta-schema does not allow (ajv skips that check at start-up)', async (t) => {
  const compilers = new SchemaCompilers([]);
  // Compiles without the meta-schema check (ajv turns a string minLength into code), so only the check finds it.
  compilers.validator({ schema: { type: 'object', properties: { name: { type: 'string', minLength: 'three' } } }, httpPart: 'body' });
  t.throws(() => compilers.compileAll(), /is not valid: .*minLength must be integer/);
  const fine = new SchemaCompilers([]);
  fine.validator({ schema: { type: 'object', properties: { name: { type: 'string', minLength: 3 } } }, httpPart: 'body' });
  t.doesNotThrow(() => fine.compileAll());
});
