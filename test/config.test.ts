// The configuration contract: generated schema and docs never drift, loading validates and names the env var.
import t from 'tap';
import { binArgv } from './helpers/process.js';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { loadConfig, ConfigError } from '../src/config/load.js';
import { ConfigSchema, configEntries } from '../src/config/schema.js';
import { renderDocs, renderSchema, root, DOCS_PATH, SCHEMA_PATH } from '../scripts/gen-config-docs.js';

const run = promisify(execFile);
const dir = mkdtempSync(join(tmpdir(), 'poolgate-config-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;
/** Writes a POOLGATE_CONFIG file and returns its path. */
function configFile(content: unknown): string {
  const path = join(dir, `config-${n++}.json`);
  writeFileSync(path, typeof content === 'string' ? content : JSON.stringify(content));
  return path;
}

function loadError(env: NodeJS.ProcessEnv): ConfigError {
  try {
    loadConfig({ env });
  } catch (err) {
    if (err instanceof ConfigError) return err;
    throw err;
  }
  throw new Error(`loadConfig accepted ${JSON.stringify(env)}`);
}

function fileValidator() {
  const ajv = new Ajv2020({ strict: true, allErrors: true });
  ajv.addKeyword('x-env');
  return ajv.compile(JSON.parse(readFileSync(SCHEMA_PATH, 'utf8')) as object);
}

t.test('committed config/schema.json and docs/configuration.md are what the generator makes now', async (t) => {
  t.equal(readFileSync(SCHEMA_PATH, 'utf8'), renderSchema(), 'config/schema.json is stale: run npm run docs:config');
  t.equal(readFileSync(DOCS_PATH, 'utf8'), renderDocs(), 'docs/configuration.md is stale: run npm run docs:config');
  const check = await run(process.execPath, ['--import=tsx', join(root, 'scripts', 'gen-config-docs.ts'), '--check'], { cwd: root }).then(
    (r) => ({ code: 0, stderr: r.stderr }),
    (err: { code: number; stderr: string }) => err,
  );
  t.same({ code: check.code, stderr: check.stderr }, { code: 0, stderr: '' }, '--check finds nothing stale');
});

t.test('every key has a unique env name and a description, and appears in the docs table', async (t) => {
  const docs = readFileSync(DOCS_PATH, 'utf8');
  const envs = new Set<string>();
  t.ok(configEntries.length > 0);
  for (const entry of configEntries) {
    t.match(entry.env, /^[A-Z][A-Z0-9_]*$/, `${entry.key} has an env name`);
    t.notOk(envs.has(entry.env), `${entry.env} is used once`);
    envs.add(entry.env);
    const description = (entry.schema as { description?: unknown }).description;
    t.ok(typeof description === 'string' && description.length > 10, `${entry.key} has a description`);
    t.ok(docs.includes(`| \`${entry.key}\` | \`${entry.env}\` |`), `${entry.key} is a row of docs/configuration.md`);
  }
});

t.test('config/default.json validates against config/schema.json; the schema refuses what the loader refuses', async (t) => {
  const validate = fileValidator();
  const shipped = JSON.parse(readFileSync(join(root, 'config', 'default.json'), 'utf8')) as Record<string, unknown>;
  t.equal(shipped.$schema, './schema.json', 'default.json points editors at the schema');
  t.ok(validate(shipped), JSON.stringify(validate.errors));
  t.notOk(validate({ controlPort: 70000 }), 'port out of range');
  t.notOk(validate({ nosuchKey: 1 }), 'unknown key');
  t.notOk(validate({ logLevel: 'loud' }), 'unknown log level');
  t.ok(validate({ databaseUrl: null, controlPort: 0 }), 'null and port 0');
  // Every schema default is itself a valid file, so the generated schema and the TypeBox schema agree.
  const defaults = Object.fromEntries(configEntries.map((e) => [e.key, (e.schema as { default?: unknown }).default]));
  t.ok(validate(defaults), JSON.stringify(validate.errors));
  t.equal(Object.keys(ConfigSchema.properties).length, configEntries.length);
});

t.test('a bad env value is a ConfigError naming the env var', async (t) => {
  const cases: Array<[string, string]> = [
    ['POOLGATE_CONTROL_PORT', 'abc'],
    ['POOLGATE_CONTROL_PORT', '70000'],
    ['POOLGATE_PROXY_PORT', '-1'],
    ['POOLGATE_ALLOW_PRIVATE_TARGETS', 'maybe'],
    ['POOLGATE_LOG_LEVEL', 'loud'],
    ['POOLGATE_POOL_DOMAIN', 'Not A Domain'],
    ['POOLGATE_CONTROL_BODY_LIMIT', '10'],
  ];
  for (const [name, value] of cases) {
    const err = loadError({ [name]: value });
    t.match(err.message, name, `${name}=${value}`);
  }
});

t.test('env overrides the POOLGATE_CONFIG file, which overrides config/default.json', async (t) => {
  const file = configFile({ $schema: './schema.json', controlPort: 8080, poolDomain: 'pools.example.test', databaseUrl: 'postgres://db/x' });
  const fromFile = loadConfig({ env: { POOLGATE_CONFIG: file } });
  t.equal(fromFile.controlPort, 8080);
  t.equal(fromFile.poolDomain, 'pools.example.test');
  t.equal(fromFile.proxyPort, 7071, 'keys the file leaves out keep their defaults');
  const withEnv = loadConfig({ env: { POOLGATE_CONFIG: file, POOLGATE_CONTROL_PORT: '9090', DATABASE_URL: '' } });
  t.equal(withEnv.controlPort, 9090);
  t.equal(withEnv.databaseUrl, null, 'an empty env value sets a nullable key to null');
  t.equal(withEnv.poolDomain, 'pools.example.test');
  t.ok(Object.isFrozen(withEnv));
});

t.test('port 0 is allowed (a free port is picked at bind)', async (t) => {
  const c = loadConfig({ env: { POOLGATE_CONTROL_PORT: '0', POOLGATE_CONFIG: configFile({ proxyPort: 0 }) } });
  t.equal(c.controlPort, 0);
  t.equal(c.proxyPort, 0);
});

t.test('booleans accept the usual spellings', async (t) => {
  for (const v of ['true', 'TRUE', '1', 'yes', 'on']) t.equal(loadConfig({ env: { POOLGATE_ALLOW_PRIVATE_TARGETS: v } }).allowPrivateTargets, true, v);
  for (const v of ['false', '0', 'no', 'off']) t.equal(loadConfig({ env: { POOLGATE_ALLOW_PRIVATE_TARGETS: v } }).allowPrivateTargets, false, v);
});

t.test('a POOLGATE_CONFIG file with an unknown key, a bad value, bad JSON or no file at all is refused', async (t) => {
  t.match(loadError({ POOLGATE_CONFIG: configFile({ controlPort: 7070, contrlPort: 1 }) }).message, 'contrlPort');
  t.match(loadError({ POOLGATE_CONFIG: configFile({ metricsRetentionDays: 0 }) }).message, /metricsRetentionDays \(POOLGATE_METRICS_RETENTION_DAYS\)/);
  t.match(loadError({ POOLGATE_CONFIG: configFile('{ "controlPort": ') }).message, 'is not a JSON object');
  t.match(loadError({ POOLGATE_CONFIG: configFile('[1, 2]') }).message, 'is not a JSON object');
  t.match(loadError({ POOLGATE_CONFIG: join(dir, 'missing.json') }).message, 'cannot read config file');
});

t.test('poolgate start refuses a bad env value before binding anything, and says which variable', async (t) => {
  const res = await run(process.execPath, binArgv('start'), {
    cwd: root,
    env: { ...process.env, POOLGATE_CONTROL_PORT: 'seventy', POOLGATE_DATA_DIR: join(dir, 'data') },
  }).then(
    () => ({ code: 0, stderr: '' }),
    (err: { code: number; stderr: string }) => err,
  );
  t.equal(res.code, 1);
  t.match(res.stderr, /POOLGATE_CONTROL_PORT must be an integer/);
});

t.test('the Dockerfile exposes the ports config/default.json binds, and its health check asks the metrics port for /readyz', async (t) => {
  const dockerfile = readFileSync(join(root, 'Dockerfile'), 'utf8');
  const shipped = JSON.parse(readFileSync(join(root, 'config', 'default.json'), 'utf8')) as Record<string, unknown>;
  const ports = configEntries.filter((e) => e.key.endsWith('Port')).map((e) => Number(shipped[e.key] ?? (e.schema as { default: number }).default));
  const exposed = (dockerfile.match(/^EXPOSE (.+)$/m)?.[1] ?? '').split(/\s+/).map(Number);
  t.same([...exposed].sort(), [...ports].sort());
  t.match(dockerfile, `(process.env.POOLGATE_METRICS_PORT || ${String(shipped.metricsPort)}) + '/readyz'`);
  t.match(dockerfile, /^ENV[^]*POOLGATE_HOST=0\.0\.0\.0/m);
  // One runtime flag set wherever `start` is launched (docs/runtime.md): the young generation's room, and
  // the embedded store's WebAssembly kept in Liftoff (TurboFan's tier-up held ~50 MB idle and peaked at ~775 MB).
  const flags = ['--max-semi-space-size=32', '--liftoff-only'];
  const cmd = JSON.parse(dockerfile.match(/^CMD (\[.*\])$/m)?.[1] ?? '[]') as string[];
  t.same(cmd, ['node', ...flags, 'bin/poolgate.js', 'start']);
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { scripts: { start: string } };
  t.equal(pkg.scripts.start, ['node', ...flags, 'bin/poolgate.js', 'start'].join(' '));
  t.equal(readFileSync(join(root, 'bin', 'poolgate.js'), 'utf8').split('\n')[0], `#!/usr/bin/env -S node ${flags.join(' ')}`);
});
