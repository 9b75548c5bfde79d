// Issue 20 item 8: poolgate is built once at install (the `prepare` script that npm install/ci run), and `npm start`
// starts without building: a second start on the same data dir refuses without rewriting the running instance's dist/.
import t from 'tap';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, statSync, readFileSync, mkdirSync, copyFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fromRoot } from '../src/config/paths.js';


const root = fromRoot();
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';

t.test('package.json: prepare builds, start does not', async (t) => {
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
  t.equal(pkg.scripts.prepare, 'node scripts/prepare.mjs');
  t.notOk(pkg.scripts.prestart, 'no prestart build');
  t.notMatch(pkg.scripts.start, /build|tsc/);
});

t.test('the prepare script skips the build where the sources are not there (the Dockerfile installs from package.json first)', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-prepare-'));
  mkdirSync(join(dir, 'scripts'));
  copyFileSync(join(root, 'scripts', 'prepare.mjs'), join(dir, 'scripts', 'prepare.mjs'));
  const r = spawnSync(process.execPath, [join(dir, 'scripts', 'prepare.mjs')], { encoding: 'utf8' });
  t.equal(r.status, 0);
  t.match(r.stdout, /not building/);
});

t.test('npm start runs the built output; a second start refuses and leaves dist/ alone', async (t) => {
  const cli = join(root, 'dist', 'src', 'cli.js');
  const before = statSync(cli).mtimeMs;
  const dataDir = mkdtempSync(join(tmpdir(), 'poolgate-start-'));
  const env = {
    ...process.env, POOLGATE_DATA_DIR: dataDir, POOLGATE_CONTROL_PORT: '0', POOLGATE_PROXY_PORT: '0', POOLGATE_LOCK_PORT: '0',
    POOLGATE_METRICS_PORT: '0', POOLGATE_PG_PORT: '0', POOLGATE_MYSQL_PORT: '0', POOLGATE_LOG_LEVEL: 'warn', npm_config_loglevel: 'silent',
  };
  // npm itself as the parent: the listening line is the first line npm start prints with loglevel silent.
  const first = spawn(npm, ['start', '--silent'], { cwd: root, env, detached: true });
  t.teardown(() => {
    try {
      process.kill(-first.pid!, 'SIGKILL');
    } catch {}
  });
  const line = await new Promise<string>((resolve, reject) => {
    let out = '';
    let err = '';
    const timer = setTimeout(() => reject(new Error(`no listening line: ${err}`)), 60_000);
    first.stderr.on('data', (c: Buffer) => (err += c));
    first.stdout.on('data', (c: Buffer) => {
      out += c;
      const m = /\{"event":"listening".*\}/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[0]);
      }
    });
  });
  t.match(JSON.parse(line), { event: 'listening' });
  t.equal(statSync(cli).mtimeMs, before, 'npm start did not rebuild');

  const second = spawnSync(npm, ['start', '--silent'], { cwd: root, env, encoding: 'utf8', timeout: 60_000 });
  t.not(second.status, 0, 'the second start refuses');
  t.match(second.stderr, /data/i, 'and says the data dir is held');
  t.equal(statSync(cli).mtimeMs, before, 'the second start did not rebuild the running instance\'s output');

});
