// Issue 26 item 8: a well-known or patterned master key (the all-zero key examples/compose.yaml used to ship) is
// refused, with how to make a real one; the compose example keeps no key, names each node's own lock API, and says
// how to bootstrap the first team.
import t from 'tap';
import { binArgv } from './helpers/process.js';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse } from 'yaml';
import { fromRoot } from '../src/config/paths.js';
import { parseMasterKey } from '../src/security/secret-box.js';

t.test('patterned keys are refused with the way to make one; random keys are taken', async (t) => {
  for (const weak of ['0'.repeat(64), '11'.repeat(32), 'f'.repeat(64), '0123456789abcdef'.repeat(4), Buffer.alloc(32).toString('base64')]) {
    t.throws(() => parseMasterKey(weak), /well-known or patterned key[\s\S]*openssl rand -hex 32/, weak);
  }
  let taken = 0;
  for (let i = 0; i < 2000; i++) taken += parseMasterKey(randomBytes(32).toString(i % 2 ? 'hex' : 'base64')).length === 32 ? 1 : 0;
  t.equal(taken, 2000, 'every one of 2,000 random keys is taken');
  t.throws(() => parseMasterKey('abcd'), /must be 32 bytes[\s\S]*openssl rand -hex 32/, 'a malformed key says how to make one too');
});

t.test('poolgate start refuses the all-zero key before it creates a store', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-weak-key-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('POOLGATE_') && k !== 'DATABASE_URL' && k !== 'REDIS_URL'));
  const child = spawn(process.execPath, binArgv('start'), {
    env: { ...env, POOLGATE_DATA_DIR: dir, POOLGATE_SECRET_KEY: '0'.repeat(64), POOLGATE_CONTROL_PORT: '0', POOLGATE_PROXY_PORT: '0', POOLGATE_LOCK_PORT: '0', POOLGATE_METRICS_PORT: '0', POOLGATE_PG_PORT: '0', POOLGATE_MYSQL_PORT: '0' },
  });
  let stderr = '';
  child.stderr.on('data', (c: Buffer) => (stderr += c));
  const [code] = (await once(child, 'close')) as [number | null];
  t.equal(code, 1);
  t.match(stderr, /POOLGATE_SECRET_KEY is a well-known or patterned key.*openssl rand -hex 32/);
  t.notOk(readdirSync(dir).includes('pglite'), 'no store was created');
});

t.test('examples/compose.yaml: no key in the repository, each node its own lock API, a bootstrap step', async (t) => {
  const env = readFileSync(fromRoot('examples', 'config', 'distributed.env'), 'utf8');
  t.notMatch(env, /^POOLGATE_SECRET_KEY=/m, 'distributed.env keeps no key');
  const text = readFileSync(fromRoot('examples', 'compose.yaml'), 'utf8');
  const compose = parse(text, { merge: true }) as { services: Record<string, { environment?: Record<string, string>; ports?: string[] }> };
  for (const name of ['control', 'dataplane-1', 'dataplane-2', 'worker']) {
    t.match(compose.services[name]!.environment?.POOLGATE_SECRET_KEY, /^\$\{POOLGATE_SECRET_KEY:\?.*openssl rand -hex 32\}$/, `${name} takes the key from the shell, and compose refuses to start without it`);
  }
  const lockUrl = (name: string) => compose.services[name]!.environment?.POOLGATE_LOCK_API_URL ?? /^POOLGATE_LOCK_API_URL=(.*)$/m.exec(env)?.[1];
  for (const [name, published] of [['dataplane-1', '7072'], ['dataplane-2', '7172']] as const) {
    t.ok(compose.services[name]!.ports!.includes(`${published}:7072`), `${name} publishes its lock API on ${published}`);
    t.equal(lockUrl(name), `http://localhost:${published}`, `${name}'s job poll URLs name its own lock API`);
  }
  t.match(text, /exec control node bin\/poolgate\.js admin bootstrap --team/, 'compose.yaml says how to bootstrap the first team');
});
