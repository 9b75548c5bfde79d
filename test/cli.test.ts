// The real binary: `node bin/poolgate.js start | control | admin …` as an operator runs it, on a temp data dir.
import t from 'tap';
import { binArgv, spawnListening, type Listening } from './helpers/process.js';
import { seedPgliteDataDir } from './helpers/pglite-template.js';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { fromRoot } from '../src/config/paths.js';

const ROOT = fromRoot();

const dataDir = mkdtempSync(join(tmpdir(), 'poolgate-cli-'));
t.teardown(() => rmSync(dataDir, { recursive: true, force: true }));
// A migrated store from the run's template (a first start's initdb is the README walk-through's to prove).
await seedPgliteDataDir(dataDir);

/** The environment of an operator's shell: nothing poolgate-specific leaks in from ours. */
function env(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const base = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !k.startsWith('POOLGATE_') && k !== 'DATABASE_URL' && k !== 'REDIS_URL' && k !== 'UWS_USE_FALLBACK' && !k.startsWith('TAP')),
  );
  return {
    ...base,
    POOLGATE_DATA_DIR: dataDir,
    POOLGATE_CONTROL_PORT: '0',
    POOLGATE_PROXY_PORT: '0',
    POOLGATE_LOCK_PORT: '0',
    POOLGATE_METRICS_PORT: '0',
    POOLGATE_PG_PORT: '0',
    POOLGATE_MYSQL_PORT: '0',
    POOLGATE_LOG_LEVEL: 'silent',
    ...extra,
  };
}

interface Run { code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }

/** Runs the binary to completion. */
async function run(args: string[], extra: Record<string, string> = {}, timeoutMs = 30_000): Promise<Run> {
  const child = spawn(process.execPath, binArgv(...args), { cwd: ROOT, env: env(extra) });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => (stdout += c));
  child.stderr.on('data', (c: Buffer) => (stderr += c));
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const [code, signal] = (await once(child, 'close')) as [number | null, NodeJS.Signals | null];
  clearTimeout(timer);
  return { code, signal, stdout, stderr };
}

type Running = Listening;

/** Starts `poolgate start` and waits for its listening line. */
const start = (): Promise<Running> => spawnListening(binArgv('start'), { cwd: ROOT, env: env(), name: 'poolgate start' });

async function stop(p: Running): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  const exited = once(p.child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
  p.child.kill('SIGTERM');
  const [code, signal] = await exited;
  return { code, signal };
}

const json = (s: string): any => JSON.parse(s.trim());

t.test('poolgate start, admin against it, then SIGTERM', async (t) => {
  const server = await start();
  t.teardown(() => server.child.kill('SIGKILL'));
  t.match(server.listening, { event: 'listening', control: Number, store: 'pglite' }, 'one JSON line announces the listeners');
  t.ok((server.listening.control as number) > 0, 'a real port was picked for port 0');
  const control = `http://127.0.0.1:${server.listening.control as number}`;

  t.equal(statSync(join(dataDir, 'secret.key')).mode & 0o777, 0o600, 'the generated master key is mode 0600');
  t.ok(existsSync(join(dataDir, 'admin.sock')), 'the admin socket is open');
  t.ok(existsSync(join(dataDir, 'poolgate.pid')), 'the data dir is locked');

  const boot = await run(['admin', 'bootstrap', '--team', 'Acme CLI', '--email', 'ops@acme.test']);
  t.equal(boot.code, 0, boot.stderr);
  const made = json(boot.stdout);
  t.match(made, { token: /^pgt_/, team: { name: 'Acme CLI', slug: 'acme-cli' }, user: { email: 'ops@acme.test', role: 'owner' } }, 'forwarded to the running process');

  const me = await request(`${control}/api/v1/me`, { headers: { authorization: `Bearer ${made.token}`, accept: 'application/json' } });
  t.equal(me.statusCode, 200);
  t.match(await me.body.json(), { team: { slug: 'acme-cli' }, user: { email: 'ops@acme.test' } }, 'the printed token works on the Control API');
  const anon = await request(`${control}/api/v1/me`);
  t.equal(anon.statusCode, 401);
  await anon.body.dump();

  const second = await run(['start']);
  t.not(second.code, 0, 'a second start on the same data dir refuses');
  t.match(second.stderr, /in use by poolgate process/);

  const stopped = await stop(server);
  t.same(stopped, { code: 0, signal: null }, 'SIGTERM exits 0');
  t.notOk(existsSync(join(dataDir, 'poolgate.pid')), 'the data dir lock is released');
  t.notOk(existsSync(join(dataDir, 'admin.sock')), 'the admin socket is removed');
  const out = server.output();
  t.equal(out.stdout.trim().split('\n').length, 1, 'stdout carries only the listening line');
});

t.test('admin commands on a stopped embedded store run directly, and what they write is served on the next start', async (t) => {
  const team = 'acme-cli';
  const user = await run(['admin', 'user', 'add', '--team', team, '--email', 'admin2@acme.test', '--role', 'admin']);
  t.equal(user.code, 0, user.stderr);
  const tok = await run(['admin', 'token', 'create', '--team', team, '--user', 'admin2@acme.test', '--abilities', 'pools:read']);
  t.equal(tok.code, 0, tok.stderr);
  const token = json(tok.stdout).token as string;
  t.match(token, /^pgt_/);
  t.notOk(existsSync(join(dataDir, 'poolgate.pid')), 'no process holds the data dir afterwards');

  const server = await start();
  t.teardown(() => server.child.kill('SIGKILL'));
  const me = await request(`http://127.0.0.1:${server.listening.control as number}/api/v1/me`, { headers: { authorization: `Bearer ${token}` } });
  t.equal(me.statusCode, 200);
  t.match(await me.body.json(), { user: { email: 'admin2@acme.test' }, abilities: ['pools:read'] });
  t.same(await stop(server), { code: 0, signal: null });
});

t.test('refusals name what is wrong and exit non-zero', async (t) => {
  const [control, fallback, port, unknown, help, flag, version] = await Promise.all([
    run(['control']),
    run(['start'], { UWS_USE_FALLBACK: '1', POOLGATE_PROXY_HTTP_PARSER: 'uws' }),
    run(['start'], { POOLGATE_CONTROL_PORT: 'abc' }),
    run(['launch']),
    run(['--help']),
    run(['start', '--port', '1']),
    run(['--version']),
  ]);
  // Issue 20: flags are not configuration; `start --port 1` no longer starts on the default port.
  t.equal(flag.code, 2, 'start with an argument exits 2');
  t.match(flag.stderr, /takes no arguments \(got --port 1\).*POOLGATE_PROXY_PORT/);
  t.equal(version.code, 0);
  t.match(version.stdout, /^\d+\.\d+\.\d+\n$/);
  t.not(control.code, 0, 'control without DATABASE_URL exits non-zero');
  t.match(control.stderr, /DATABASE_URL/);

  t.not(fallback.code, 0, 'start with proxyHttpParser=uws on the uWS fallback exits non-zero');
  t.match(fallback.stderr, /UWS_USE_FALLBACK/);
  t.notOk(existsSync(join(dataDir, 'poolgate.pid')), 'it refused before locking the data dir');

  t.not(port.code, 0, 'an invalid env value exits non-zero');
  t.match(port.stderr, /POOLGATE_CONTROL_PORT/);

  t.equal(unknown.code, 2, 'an unknown command exits 2');
  t.match(unknown.stderr, /usage: poolgate/);

  t.equal(help.code, 0);
  t.match(help.stdout, /usage: poolgate <command>/);
});

t.test('admin help and command-line mistakes are answered without opening a store', async (t) => {
  // A data dir that does not exist: opening the embedded store would create it (and run initdb, seconds).
  const nowhere = join(tmpdir(), `poolgate-cli-nowhere-${process.pid}`);
  t.teardown(() => rmSync(nowhere, { recursive: true, force: true }));
  const [help, cmdHelp, unknown, bogus] = await Promise.all([
    run(['admin', '--help'], { POOLGATE_DATA_DIR: nowhere }),
    run(['admin', 'pool', 'create', '--help'], { POOLGATE_DATA_DIR: nowhere }),
    run(['admin', 'frobnicate'], { POOLGATE_DATA_DIR: nowhere }),
    run(['admin', 'bootstrap', '--team', 'x', '--email', 'x@y.test', '--bogus'], { POOLGATE_DATA_DIR: nowhere }),
  ]);
  t.equal(help.code, 0);
  t.match(help.stdout, /^usage: poolgate admin <command>/);
  t.match(help.stdout, /poolgate admin token create /, 'it lists the commands (each one’s --help: admin-operator.test.ts)');
  t.equal(cmdHelp.code, 0);
  t.match(cmdHelp.stdout, /^usage: poolgate admin pool create\b/);
  t.equal(unknown.code, 2);
  t.match(unknown.stderr, /unknown admin command: frobnicate/);
  t.equal(bogus.code, 2, 'an unknown flag exits 2');
  t.match(bogus.stderr, /bogus[\s\S]*usage: poolgate admin bootstrap/);
  t.equal(bogus.stdout, '');
  t.notOk(existsSync(nowhere), 'the data dir was never created');
});
