// Issue 20 item 3: the README's "First pool, first request" runs end to end without internet, from a fresh data dir,
// through child processes, with the commands as the README writes them. Only these substitutions are made, so that
// the test can run beside others on a shared machine: the default ports (7070, 7071, 8443) become free ports, the
// other listeners take port 0, and ./data becomes a fresh temp dir.
import t from 'tap';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fromRoot } from '../src/config/paths.js';
import { freePort } from './helpers/redis-server.js';

const root = fromRoot();
const readme = readFileSync(join(root, 'README.md'), 'utf8');

/** The shell block after `<!-- walkthrough:NAME -->`. */
function block(name: string): string {
  const m = new RegExp(`<!-- walkthrough:${name} -->\\n\`\`\`sh\\n([\\s\\S]*?)\`\`\``).exec(readme);
  if (!m) throw new Error(`README has no walkthrough:${name} block`);
  return m[1]!;
}

function spawnShell(script: string, env: NodeJS.ProcessEnv): ChildProcess {
  return spawn('bash', ['-euo', 'pipefail', '-c', script], { cwd: root, env, detached: true });
}

/** Resolves with the first stdout line matching `re`; rejects if the process exits first. */
function lineOf(child: ChildProcess, re: RegExp, what: string, timeoutMs = 180_000): Promise<string> {
  let out = '';
  let err = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what}: no ${re} within ${timeoutMs / 1000} s; stderr: ${err}`)), timeoutMs);
    child.stderr!.on('data', (c: Buffer) => (err = (err + c).slice(-8192)));
    child.stdout!.on('data', (c: Buffer) => {
      out += c;
      const m = re.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[0]);
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${what} exited (${code}); stderr: ${err}`));
    });
  });
}

/** The JSON values printed one after another (curl adds no newline after a Control API answer). */
function jsonValues(text: string): Array<Record<string, any>> {
  const values: Array<Record<string, any>> = [];
  let depth = 0;
  let inString = false;
  let start = -1;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      if (c === '\\') i++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === '{') {
      if (depth++ === 0) start = i;
    } else if (c === '}' && --depth === 0) values.push(JSON.parse(text.slice(start, i + 1)) as Record<string, any>);
  }
  return values;
}

t.test('README walk-through: demo origin, npm start, bootstrap, pool, key, request by Host and by X-Service-Pool', async (t) => {
  const dataDir = mkdtempSync(join(tmpdir(), 'poolgate-readme-'));
  const [control, proxy, origin, pgWire, mysqlWire] = [await freePort(), await freePort(), await freePort(), await freePort(), await freePort()];
  const sub = (s: string) =>
    s.replaceAll('./data', dataDir).replaceAll('7070', String(control)).replaceAll('7071', String(proxy)).replaceAll('8443', String(origin))
      .replaceAll('15432', String(pgWire)).replaceAll('13306', String(mysqlWire));
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    POOLGATE_CONTROL_PORT: String(control), POOLGATE_PROXY_PORT: String(proxy), POOLGATE_LOCK_PORT: '0', POOLGATE_METRICS_PORT: '0',
    POOLGATE_PG_PORT: String(pgWire), POOLGATE_MYSQL_PORT: String(mysqlWire), POOLGATE_DATA_DIR: dataDir, npm_config_loglevel: 'silent',
  };
  // No configuration of the developer's shell leaks in (the README assumes a fresh shell).
  for (const k of Object.keys(env)) if ((k.startsWith('POOLGATE_') && !(k in portsAndDir(env))) || k === 'DATABASE_URL' || k === 'REDIS_URL') delete env[k];
  const children: ChildProcess[] = [];
  t.teardown(() => {
    for (const c of children) {
      try {
        process.kill(-c.pid!, 'SIGTERM');
      } catch {}
    }
  });

  const originShell = spawnShell(sub(block('origin')), env);
  children.push(originShell);
  const originLine = JSON.parse(await lineOf(originShell, /\{"event":"listening".*\}/, 'demo-origin')) as { url: string; caFile: string };
  t.equal(originLine.url, `https://127.0.0.1:${origin}`);
  t.equal(originLine.caFile, join(dataDir, 'demo-origin', 'cert.pem'), 'the certificate is where the README says');

  const startShell = spawnShell(sub(block('start')), env);
  children.push(startShell);
  const listening = JSON.parse(await lineOf(startShell, /\{"event":"listening".*\}/, 'npm start')) as Record<string, unknown>;
  t.equal(listening.control, control);

  const requests = spawnShell(sub(block('requests')), env);
  children.push(requests);
  let out = '';
  let err = '';
  requests.stdout!.on('data', (c: Buffer) => (out += c));
  requests.stderr!.on('data', (c: Buffer) => (err += c));
  const code = await new Promise<number | null>((resolve) => requests.once('exit', resolve));
  t.equal(code, 0, `the requests block succeeds; stderr: ${err}`);
  const lines = jsonValues(out);
  t.equal(lines.length, 3, `three answers (me, curl, fetch): ${out}`);
  t.match(lines[0], { team: { name: 'Acme' } }, '/me');
  for (const [i, how] of [[1, 'Host'], [2, 'X-Service-Pool']] as const) {
    t.equal(lines[i]!.origin, 'poolgate demo origin', `the request by ${how} reached the demo origin`);
    t.equal(lines[i]!.url, '/v1/things');
    t.notOk(lines[i]!.headers['x-service-key'], 'the pool key is not forwarded');
    t.notOk(lines[i]!.headers['x-service-pool'], 'nor the pool header');
  }

  // Issue 26 items 2 and 3: the webhook and database blocks, in the shell of the requests block. Running the requests
  // again (a second bootstrap of the same team) works: the same team, a new token, no acme-2.
  const again = spawnShell(sub([block('requests'), block('webhooks'), block('databases')].join('\n')), env);
  children.push(again);
  let out2 = '';
  let err2 = '';
  again.stdout!.on('data', (c: Buffer) => (out2 += c));
  again.stderr!.on('data', (c: Buffer) => (err2 += c));
  t.equal(await new Promise<number | null>((resolve) => again.once('exit', resolve)), 0, `the walk-through runs twice, webhooks and databases too; stderr: ${err2}`);
  const values = jsonValues(out2);
  t.match(values[0], { team: { name: 'Acme' } });
  t.match(values[3], { id: String, status: 'queued' }, 'the async request is accepted with a job id');
  const delivered = values.find((v) => Array.isArray(v.data) && v.data[0]?.result);
  t.match(delivered?.data?.[0], { result: 'success', http_status: 200 }, `the job was delivered to the demo origin through POOLGATE_WEBHOOK_CA_FILE: ${out2}`);
  t.match(out2, /^postgres says 42$/m, 'psql ran a query through the PostgreSQL wire port');
  t.match(out2, /^work_mem 1MB$/m, 'a setting outside the kept list, given at login, is applied (issue 26 item 9)');
  t.match(out2, /^mariadb says 42$/m, 'the mariadb client ran a query through the MySQL wire port');
  t.match(values.at(-1), { columns: [{ name: 'n' }], rows: [[42]] }, 'SQL over HTTP on the PostgreSQL pool');
});

/** The settings the test itself gives (ports, data dir); every other POOLGATE_ variable is the developer's and is dropped. */
function portsAndDir(env: NodeJS.ProcessEnv): Record<string, unknown> {
  return Object.fromEntries(['POOLGATE_CONTROL_PORT', 'POOLGATE_PROXY_PORT', 'POOLGATE_LOCK_PORT', 'POOLGATE_METRICS_PORT', 'POOLGATE_PG_PORT', 'POOLGATE_MYSQL_PORT', 'POOLGATE_DATA_DIR'].map((k) => [k, env[k]]));
}
