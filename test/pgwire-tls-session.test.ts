// The PostgreSQL wire listener with TLS (the pool named by SNI <subdomain>.{pool_domain}, the certificate
// trusted by psql and node-postgres), session mode against transaction mode (what SET survives), and the
// session parameters a client gives at login, kept on every server connection it uses.
import t from 'tap';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { needServer } from './helpers/servers.js';
import { assertNothingHeld, runTool, startWirePool, type WirePool } from './helpers/pgwire.js';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  // A self-signed certificate for every pool name under pools.localhost (its own CA).
  const dir = mkdtempSync(join(tmpdir(), 'pgwire-tls-'));
  const cert = join(dir, 'cert.pem');
  const key = join(dir, 'key.pem');
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '2',
    '-subj', '/CN=pools.localhost', '-addext', 'subjectAltName=DNS:*.pools.localhost',
    '-keyout', key, '-out', cert,
  ], { stdio: 'ignore' });
  const w: WirePool = await startWirePool({ maxConcurrent: 2, overrides: { wireTlsCertFile: cert, wireTlsKeyFile: key } });
  t.teardown(async () => {
    await w.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const host = `${w.sub}.pools.localhost`;
  const connect = async (extra: Partial<pg.ClientConfig> = {}) => {
    const c = new pg.Client(w.clientConfig(extra));
    c.on('error', () => {});
    await c.connect();
    return c;
  };

  t.test('psql with verify-full: TLS with the configured certificate, the pool named by SNI alone', async (t) => {
    const conninfo = `host=${host} hostaddr=127.0.0.1 port=${w.port} dbname=x user=x password=${w.key} sslmode=verify-full sslrootcert=${cert}`;
    const r = await runTool('psql', ['-X', '-At', conninfo, '-c', 'SELECT current_user']);
    t.equal(r.code, 0, r.stderr);
    t.equal(r.stdout.trim(), w.role);
    const info = await runTool('psql', ['-X', '-At', conninfo, '-c', '\\conninfo']);
    t.match(info.stdout, /SSL connection \(protocol: TLSv1\.[23]/, 'the session is encrypted');
  });

  t.test('node-postgres over TLS trusting the certificate by ssl.ca, named by SNI', async (t) => {
    const c = await connect({ options: undefined, ssl: { ca: readFileSync(cert, 'utf8'), servername: host } });
    const r = await c.query('SELECT $1::text AS v', ['over tls']);
    t.equal(r.rows[0].v, 'over tls');
    await c.end();
  });

  t.test('an SNI name outside the pool domain falls back to options=pool=<sub>', async (t) => {
    const r = await runTool('psql', ['-X', '-At', w.conninfo({ sslmode: 'require' }), '-c', 'SELECT 1']);
    t.equal(r.code, 0, r.stderr);
    t.equal(r.stdout.trim(), '1');
  });

  t.test('transaction mode: tracked session parameters follow the client; another SET pins its client, never reaching the other', async (t) => {
    const a = await connect();
    const b = await connect();
    const show = async (c: pg.Client) =>
      (await c.query("SELECT current_setting('application_name') AS app, current_setting('work_mem') AS mem")).rows[0] as { app: string; mem: string };
    await a.query("SET application_name = 'client-a'");
    await a.query("SET work_mem = '7MB'");
    // b takes the idle connection a just used (newest first) and keeps it inside a transaction.
    await b.query('BEGIN');
    const seenByB = await show(b);
    t.equal(seenByB.app, '', "b has its own application_name (PostgreSQL's default, empty), not a's");
    t.not(seenByB.mem, '7MB', 'an untracked setting (work_mem) pinned a to its server connection: b does not see it');
    const seenByA = await show(a);
    t.equal(seenByA.app, 'client-a', 'a keeps the application_name it set');
    t.equal(seenByA.mem, '7MB', 'and its untracked setting');
    await b.query('COMMIT');
    await a.end();
    await b.end();
  });

  t.test('session mode: SET persists across transactions, and the next session starts reset', async (t) => {
    await w.patch({ settings: { wirePoolMode: 'session' } });
    const a = await connect();
    const b = await connect();
    await a.query("SET application_name = 'session-a'");
    await a.query('PREPARE mine AS SELECT 1');
    await b.query('BEGIN');
    await b.query('SELECT 1');
    for (let i = 0; i < 3; i++) {
      const r = await a.query('SELECT current_setting($1) AS v', ['application_name']);
      t.equal(r.rows[0].v, 'session-a', `transaction ${i + 1}: the setting is still there`);
    }
    t.equal((await b.query('SELECT current_setting($1) AS v', ['application_name'])).rows[0].v, '', 'the other session does not see it');
    await b.query('COMMIT');
    t.equal(w.svc.service.dataplane!.governor.state(w.poolId).inFlight, 2, 'each session holds its slot between transactions');
    await a.end();
    await b.end();
    // Both server connections were reset (DISCARD ALL) before reuse.
    const c = await connect();
    const d = await connect();
    for (const x of [c, d]) {
      const r = await x.query("SELECT current_setting('application_name') AS v, (SELECT count(*)::int FROM pg_prepared_statements) AS p");
      t.equal(r.rows[0].v, '', 'no setting from the session before');
      t.equal(r.rows[0].p, 0, 'no prepared statement from the session before');
    }
    // A third session waits for a slot: with the queue timeout short it is refused at login.
    await w.patch({ settings: { wirePoolMode: 'session', queueTimeoutMs: 200 } });
    const e = new pg.Client(w.clientConfig());
    const err = await e.connect().then(() => null, (x: { code?: string; message: string }) => x);
    t.equal(err?.code, '53300', `refused a session slot: ${err?.message}`);
    await c.end();
    await d.end();
    await w.patch({ settings: { wirePoolMode: null, queueTimeoutMs: null } });
  });

  t.test('session parameters given at login (startup packet, options=-c) are kept on every server connection', async (t) => {
    // Two clients on the one server connection of a pool of one, each with its own TimeZone and application_name.
    await w.patch({ max_concurrent: 1 });
    const tokyo = await connect({ options: `pool=${w.sub} -c TimeZone=Asia/Tokyo`, application_name: 'tokyo-app' });
    const plain = await connect({ application_name: 'plain-app' });
    const seen = async (c: pg.Client) =>
      (await c.query("SELECT current_setting('TimeZone') AS tz, current_setting('application_name') AS app, to_char(timestamptz '2026-01-01 00:00:00+00', 'HH24') AS h")).rows[0];
    for (let i = 0; i < 3; i++) {
      t.same(await seen(tokyo), { tz: 'Asia/Tokyo', app: 'tokyo-app', h: '09' }, `round ${i}: the Tokyo client sees its time zone`);
      t.same(await seen(plain), { tz: 'Etc/UTC', app: 'plain-app', h: '00' }, `round ${i}: the other client sees the default`);
    }
    t.equal((await w.direct.query('SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1', [w.role])).rows[0].n, 1, 'all on one server connection');
    await tokyo.end();
    await plain.end();
    // A value the server refuses ends that client with the server's error, when its first transaction starts.
    const bad = await connect({ options: `pool=${w.sub} -c TimeZone=Mars/Olympus_Mons` });
    const err = await bad.query('SELECT 1').then(() => null, (e: { code?: string; message: string }) => e);
    t.equal(err?.code, '22023', `refused: ${err?.message}`);
    t.match(err?.message, /TimeZone/);
    await bad.end().catch(() => {});
    // Settings other than the tracked ones are still refused at login.
    const other = new pg.Client(w.clientConfig({ options: `pool=${w.sub} -X` }));
    other.on('error', () => {});
    t.equal((await other.connect().then(() => null, (e: { code?: string }) => e))?.code, '0A000', 'an options word that is not a setting is refused');
  });

  t.test('nothing is left held', (t) => assertNothingHeld(t, w));
}
