// Runs the MariaDB Connector/Node.js integration tests (issue 30) directly against MariaDB and through
// poolgate's MySQL listener (wirePoolMode transaction and session), and prints the counts.
// The connector's repository is not part of poolgate: check it out and install its dev dependencies first,
//   git clone https://github.com/mariadb-corporation/mariadb-connector-nodejs /tmp/mcn && (cd /tmp/mcn && npm install)
// then, after `npm run build` here:
//   node bench/mariadb-connector-suite.mjs /tmp/mcn [direct|transaction|session ...] [vitest file filters ...]
// MariaDB on 127.0.0.1:3306, root without a password, database testn (created if missing).
import { spawn, execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const [suite = '/tmp/mcn', ...rest] = process.argv.slice(2);
const modes = rest.filter((a) => ['direct', 'transaction', 'session'].includes(a));
const files = rest.filter((a) => !modes.includes(a));
execFileSync('mysql', ['-h', '127.0.0.1', '-uroot', '-e', 'CREATE DATABASE IF NOT EXISTS testn']);

function vitest(env, out) {
  return new Promise((resolve) => {
    const child = spawn(join(suite, 'node_modules', '.bin', 'vitest'), ['--no-file-parallelism', '--reporter=json', `--outputFile=${out}`, 'run', ...(files.length ? files : ['test/integration'])], {
      cwd: suite, env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'ignore'],
    });
    child.on('close', () => {
      const r = JSON.parse(readFileSync(out, 'utf8'));
      const failed = r.testResults.flatMap((f) => f.assertionResults.filter((a) => a.status === 'failed').map((a) => `${f.name.replace(suite + '/', '')} > ${a.fullName}`));
      resolve({ passed: r.numPassedTests, failed: r.numFailedTests, skipped: r.numPendingTests + r.numTodoTests, total: r.numTotalTests, failedNames: failed });
    });
  });
}

async function throughPoolgate(mode) {
  const { startTestService } = await import(join(root, 'dist/test/helpers/service.js'));
  const svc = await startTestService({ overrides: { dbAllowInsecure: true, accessLogFile: '/dev/null', logLevel: process.env.TEST_LOG_LEVEL ?? 'silent' } });
  try {
    const { token } = await svc.bootstrap();
    const created = await svc.api('POST', '/api/v1/pools/database', { token, body: { db_host: '127.0.0.1', db_port: 3306, db_name: 'testn' } });
    if (created.status !== 201) throw new Error(`pool not created: ${JSON.stringify(created.body)}`);
    const sub = created.body.data.subdomain;
    await svc.api('PUT', `/api/v1/pools/${sub}/credential`, { token, body: { method: 'postgres_role', username: 'root' } });
    const set = await svc.api('PATCH', `/api/v1/pools/${sub}/settings`, { token, body: { max_concurrent: 100, settings: { wirePoolMode: mode, queueTimeoutMs: 30_000 } } });
    if (set.status !== 200) throw new Error(`settings refused: ${JSON.stringify(set.body)}`);
    const key = (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token })).body.data.key;
    await svc.service.dataplane.snapshots.reload();
    return await vitest({ TEST_DB_HOST: '127.0.0.1', TEST_DB_PORT: String(svc.service.ports.mysql), TEST_DB_USER: sub, TEST_DB_PASSWORD: key, TEST_DB_DATABASE: 'testn' }, `/tmp/mcn-${mode}.json`);
  } finally {
    await svc.close();
  }
}

for (const mode of modes.length ? modes : ['direct', 'transaction', 'session']) {
  const r = mode === 'direct' ? await vitest({ TEST_DB_HOST: '127.0.0.1', TEST_DB_PORT: '3306' }, '/tmp/mcn-direct.json') : await throughPoolgate(mode);
  console.log(JSON.stringify({ mode, passed: r.passed, failed: r.failed, skipped: r.skipped, total: r.total }));
  if (process.env.SHOW_FAILED) for (const n of r.failedNames) console.log(`  failed: ${n}`);
}
process.exit(0);
