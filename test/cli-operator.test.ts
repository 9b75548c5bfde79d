// Issue 26 items 1 and 7: the admin CLI does not depend on the current directory (no command but bootstrap creates a
// store or a master key; the others refuse, naming the path they looked at and how to point them at the right one),
// and the CLI's rough edges: demo-origin --help, admin --version, a bare poolgate, slugs in any case, --lifetime 1mo,
// lists of teams, users and tokens.
import t from 'tap';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runAdmin } from '../src/admin/commands.js';
import { version } from '../src/version.js';
import { seedPgliteDataDir } from './helpers/pglite-template.js';
import { binArgv } from './helpers/process.js';
import { startTestApi } from './helpers/service.js';


interface Run { code: number | null; stdout: string; stderr: string }

/** The binary as an operator runs it: from `cwd`, with no poolgate settings but `extra`. */
async function run(args: string[], cwd: string, extra: Record<string, string> = {}): Promise<Run> {
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('POOLGATE_') && k !== 'DATABASE_URL' && k !== 'REDIS_URL' && !k.startsWith('TAP')));
  const child = spawn(process.execPath, binArgv(...args), { cwd, env: { ...base, POOLGATE_LOG_LEVEL: 'silent', ...extra } });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => (stdout += c));
  child.stderr.on('data', (c: Buffer) => (stderr += c));
  const [code] = (await once(child, 'close')) as [number | null];
  return { code, stdout, stderr };
}

const elsewhere = mkdtempSync(join(tmpdir(), 'poolgate-elsewhere-'));
t.teardown(() => rmSync(elsewhere, { recursive: true, force: true }));

t.test('outside the repository, admin commands other than bootstrap create nothing and say where they looked', async (t) => {
  const r = await run(['admin', 'pool', 'set', 'x', '--team', 'acme', '--max-concurrent', '3'], elsewhere);
  t.equal(r.code, 1);
  const looked = join(elsewhere, 'data', 'pglite');
  t.match(r.stderr, `no store at ${looked}; nothing was created`, 'it names the path it looked at');
  t.match(r.stderr, /POOLGATE_DATA_DIR \("\.\/data", here .*current directory/, 'and the setting that decides it');
  t.match(r.stderr, /set POOLGATE_DATA_DIR=\/path\/to\/its\/data/, 'and how to point it at the right store');
  t.match(r.stderr, /`poolgate admin bootstrap` creates a new store/);
  t.same(readdirSync(elsewhere), [], 'no ./data, no pglite, no secret.key');

  const pg = await run(['admin', 'team', 'list'], elsewhere, { DATABASE_URL: 'postgres://postgres@127.0.0.1:5432/template1' });
  if (pg.stderr.includes('ECONNREFUSED')) return;
  t.equal(pg.code, 1, 'a PostgreSQL database without poolgate\'s schema is refused too');
  t.match(pg.stderr, /no poolgate store in the database at DATABASE_URL.*nothing was created/);
  t.same(readdirSync(elsewhere), [], 'no secret.key written either');
});

t.test('a store without its master key is refused (a new key would open none of its secrets); bootstrap makes one', async (t) => {
  const dataDir = mkdtempSync(join(tmpdir(), 'poolgate-nokey-'));
  t.teardown(() => rmSync(dataDir, { recursive: true, force: true }));
  await seedPgliteDataDir(dataDir);
  const env = { POOLGATE_DATA_DIR: dataDir };
  const refused = await run(['admin', 'team', 'list'], elsewhere, env);
  t.equal(refused.code, 1);
  t.match(refused.stderr, `POOLGATE_SECRET_KEY is not set and ${join(dataDir, 'secret.key')} does not exist; nothing was created`);
  t.notOk(existsSync(join(dataDir, 'secret.key')));

  const boot = await run(['admin', 'bootstrap', '--team', 'Acme Corp', '--email', 'ops@acme.test'], elsewhere, env);
  t.equal(boot.code, 0, boot.stderr);
  t.ok(existsSync(join(dataDir, 'secret.key')), 'bootstrap made the key');
  const listed = await run(['admin', 'team', 'list'], elsewhere, env);
  t.equal(listed.code, 0, listed.stderr);
  t.match(JSON.parse(listed.stdout), { teams: [{ slug: 'acme-corp', name: 'Acme Corp', users: 1, pools: 0 }] }, 'from any directory, given the data dir');
  t.same(readdirSync(elsewhere), [], 'still nothing in the current directory');
});

t.test('--help, --version and a bare poolgate', async (t) => {
  const help = await run(['demo-origin', '--help'], elsewhere);
  t.equal(help.code, 0, help.stderr);
  t.match(help.stdout, /^usage: poolgate demo-origin \[--port 8443\]/);
  const bad = await run(['demo-origin', '--bogus'], elsewhere);
  t.equal(bad.code, 2);
  t.match(bad.stderr, /Unknown option '--bogus'[\s\S]*usage: poolgate demo-origin/);

  const v = await run(['admin', '--version'], elsewhere);
  t.same(v, { code: 0, stdout: `${version()}\n`, stderr: '' }, 'admin --version prints the version');

  const bare = await run([], elsewhere);
  t.equal(bare.code, 2, 'a bare poolgate is a mistake');
  t.match(bare.stderr, /concurrency gateway[\s\S]*usage: poolgate <command>[\s\S]*start[\s\S]*admin[\s\S]*First steps/, 'and says what it can do');
  t.same(readdirSync(elsewhere), []);
});

t.test('slugs in any case, --lifetime 1mo, team/user/token lists', async (t) => {
  const svc = await startTestApi();
  t.teardown(() => svc.close());
  const deps = { config: svc.config, sql: svc.sql, box: svc.box, now: () => new Date() };
  const admin = async (...argv: string[]) => {
    const r = await runAdmin(argv, deps);
    return { ...r, json: r.code === 0 ? JSON.parse(r.stdout) : null };
  };
  const boot = await admin('bootstrap', '--team', 'Acme Corp', '--email', 'ops@acme.test', '--plan', 'team');
  t.equal(boot.code, 0, boot.stderr);
  const upper = await admin('user', 'add', '--team', 'ACME-CORP', '--email', 'dev@acme.test', '--role', 'admin');
  t.equal(upper.code, 0, `the slug in upper case finds the team: ${upper.stderr}`);

  const ambiguous = await admin('token', 'create', '--team', 'acme-corp', '--user', 'dev@acme.test', '--lifetime', '1m');
  t.equal(ambiguous.code, 2);
  t.match(ambiguous.stderr, /--lifetime 1m is ambiguous \(minutes or months\?\): say 1mo, 6mo or 1y/);
  const month = await admin('token', 'create', '--team', 'acme-corp', '--user', 'dev@acme.test', '--lifetime', '1mo', '--name', 'ci');
  t.equal(month.code, 0, month.stderr);
  const days = (Date.parse(month.json.expires_at) - Date.now()) / 86_400_000;
  t.ok(days > 27 && days < 32, `1mo is a month (${days.toFixed(1)} days)`);

  const teams = await admin('team', 'list');
  t.match(teams.json, { teams: [{ slug: 'acme-corp', plan: 'team', users: 2 }] });
  const users = await admin('user', 'list', '--team', 'acme-corp');
  t.match(users.json.users.map((u: { email: string; role: string }) => `${u.email} ${u.role}`), ['ops@acme.test owner', 'dev@acme.test admin']);
  const tokens = await admin('token', 'list', '--team', 'acme-corp');
  t.equal(tokens.json.tokens.length, 2, 'the bootstrap token and the ci token');
  t.match(tokens.json.tokens[1], { id: month.json.id, name: 'ci', user: 'dev@acme.test', token: `…${month.json.token.slice(-4)}`, revoked_at: null });
  t.notOk(JSON.stringify(tokens.json).includes(month.json.token), 'never the token itself');
  t.equal((await admin('token', 'revoke', '--team', 'acme-corp', '--id', String(month.json.id))).code, 0);
  t.equal((await admin('token', 'list', '--team', 'acme-corp')).json.tokens.length, 1, 'a revoked token leaves the list');
  t.equal((await admin('token', 'list', '--team', 'acme-corp', '--all')).json.tokens.length, 2, '--all shows it');
});
