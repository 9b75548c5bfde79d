// Issue 20 items 2 and 3: the wire listeners and the Control API log what an operator needs (failed logins, refusals,
// upstream errors; one line per API request with the token's id) and never a secret; a database that refuses TLS
// names POOLGATE_DB_ALLOW_INSECURE in the error the client gets.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { pino } from 'pino';
import { startTestService } from './helpers/service.js';
import { needServer, PG_URL } from './helpers/servers.js';
import { prettyLine } from '../src/log.js';

t.test('pgwire refusals, the TLS hint and Control API lines are logged, secrets never', async (t) => {
  const skip = await needServer('postgres');
  if (skip) return t.skip(skip);
  const lines: Array<Record<string, any>> = [];
  const log = pino({ level: 'info' }, { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, any>) });
  const suffix = randomBytes(4).toString('hex');
  const role = `oplog_${suffix}`;
  const password = `pw-${randomBytes(8).toString('hex')}`;
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  await admin.query(`CREATE ROLE ${role} LOGIN PASSWORD '${password}'`);
  t.teardown(async () => {
    await admin.query(`DROP ROLE IF EXISTS ${role}`);
    await admin.end();
  });
  const ssl = (await admin.query<{ ssl: string }>('SHOW ssl')).rows[0]!.ssl;

  // dbAllowInsecure off: a local server without TLS is refused, naming the setting.
  const svc = await startTestService({ overrides: { dbAllowInsecure: false, accessLogFile: '/dev/null' }, log });
  t.teardown(() => svc.close());
  const { token } = await svc.bootstrap();
  const pool = await svc.api('POST', '/api/v1/pools/database', { token, body: { db_host: '127.0.0.1', db_port: 5432, db_name: 'postgres', db_sslmode: 'require' } });
  const sub = pool.body.data.subdomain as string;
  await svc.api('PUT', `/api/v1/pools/${sub}/credential`, { token, body: { method: 'postgres_role', username: role, password } });
  const key = (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token })).body.data.key as string;
  await svc.service.dataplane!.snapshots.reload();
  const cfg = { host: '127.0.0.1', port: svc.service.ports.pg!, user: 'someone', database: 'postgres', options: `pool=${sub}` };

  const wrong = new pg.Client({ ...cfg, password: 'not-a-key' });
  wrong.on('error', () => {});
  await t.rejects(wrong.connect(), { code: '28P01' });
  const refused = lines.find((l) => l.event === 'pgwire' && l.outcome === 'login refused');
  t.match(refused, { level: 40, pool: sub, code: '28P01', user: 'someone', peer: /127\.0\.0\.1/ }, 'a failed login is logged with pool, code, user, peer');

  if (ssl === 'off') {
    const c = new pg.Client({ ...cfg, password: key });
    c.on('error', () => {});
    const err = await c.connect().then(() => null, (e: Error) => e);
    t.match(err?.message, /POOLGATE_DB_ALLOW_INSECURE/, 'the client is told which setting allows a server without TLS');
    t.ok(lines.some((l) => l.event === 'pgwire' && /POOLGATE_DB_ALLOW_INSECURE/.test(l.message ?? '')), 'and the log says it too');
    await c.end().catch(() => {});
  } else t.comment('the local PostgreSQL has TLS on: the POOLGATE_DB_ALLOW_INSECURE hint is not exercised');

  const control = lines.filter((l) => l.event === 'control');
  t.ok(control.length >= 4, 'one line per Control API request');
  t.match(control.find((l) => l.route === '/api/v1/pools/:pool/keys'), { method: 'POST', status: 201, pool: sub, tokenId: Number, ms: Number });
  const unauth = await svc.api('GET', '/api/v1/me', { token: 'pgt_wrong' });
  t.equal(unauth.status, 401);
  t.match(lines.filter((l) => l.event === 'control').at(-1), { route: '/api/v1/me', status: 401 });

  const all = JSON.stringify(lines);
  for (const secret of [token, key, password, 'not-a-key']) t.notOk(all.includes(secret), 'no token, key or password in the log');
});

t.test('pretty log lines: time, level, message, fields', async (t) => {
  const line = prettyLine(JSON.stringify({ level: 40, time: Date.UTC(2026, 0, 1, 12, 0, 0, 5), msg: 'pgwire: login refused', pool: 'acme', code: '28P01', service: 'poolgate' }));
  t.equal(line, '12:00:00.005 WARN  pgwire: login refused  pool=acme code=28P01\n');
});
