// Wire fidelity for real clients (issue 14, bugs 1–3): a client's Terminate is poolgate's to act on (the
// server connection is reset and reused, never closed under the client), the server's own FATAL reaches the
// client (57P01 from pg_terminate_backend, which drivers key failover on), and a Terminate sent before any
// startup packet (node-postgres on connect(); end()) is met with a quiet close, as PostgreSQL does.
import t from 'tap';
import { connect as tcpConnect } from 'node:net';
import { once } from 'node:events';
import pg from 'pg';
import { needServer } from './helpers/servers.js';
import { assertNothingHeld, startWirePool, type WirePool } from './helpers/pgwire.js';
import { until as waitFor } from './helpers/until.js';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  const w: WirePool = await startWirePool({ maxConcurrent: 2 });
  t.teardown(() => w.close());
  const listener = () => w.svc.service.pgWire!;
  /** The shared until, naming the listener's counts when a wait runs out. */
  const until = (what: string, check: () => boolean | Promise<boolean>, ms = 20_000) =>
    waitFor(() => `${what}: ${JSON.stringify(listener().counts())}`, check, ms);
  const settled = () => until('the listener to settle', () => {
    const c = listener().counts();
    return c.clients === 0 && c.linked === 0 && c.serversOpen === c.serversIdle;
  });

  /** A Query message. */
  const query = (sql: string) => {
    const body = Buffer.from(`${sql}\0`);
    const head = Buffer.alloc(5);
    head[0] = 0x51;
    head.writeInt32BE(body.length + 4, 1);
    return Buffer.concat([head, body]);
  };

  /** Logs in on a raw socket, writes `after` in one go once ReadyForQuery came, and returns what came back until the close (latin1). */
  const rawSession = (pool: WirePool, after: Buffer[]) =>
    new Promise<string>((resolve, reject) => {
      const s = tcpConnect(pool.port, '127.0.0.1');
      let got = Buffer.alloc(0);
      let loggedIn = false;
      s.on('data', (c: Buffer) => {
        got = Buffer.concat([got, c]);
        if (got[0] === 0x52 && got.length === 9 && got.readInt32BE(5) === 3) {
          // AuthenticationCleartextPassword: the key.
          const pw = Buffer.from(`${pool.key}\0`);
          const head = Buffer.alloc(5);
          head[0] = 0x70;
          head.writeInt32BE(pw.length + 4, 1);
          s.write(Buffer.concat([head, pw]));
          got = Buffer.alloc(0);
        } else if (!loggedIn && got.includes(Buffer.from([0x5a, 0, 0, 0, 5, 0x49]))) {
          loggedIn = true;
          got = Buffer.alloc(0);
          s.write(Buffer.concat(after));
        }
      });
      s.on('error', reject);
      s.on('close', () => resolve(got.toString('latin1')));
      s.on('connect', () => {
        const params = Buffer.from(`user\0u\0database\0d\0options\0pool=${pool.sub}\0\0`);
        const head = Buffer.alloc(8);
        head.writeInt32BE(params.length + 8, 0);
        head.writeInt32BE(196608, 4);
        s.write(Buffer.concat([head, params]));
      });
    });

  /** Sends a startup packet with these parameters (and the pool) on a raw socket; what came back until the close. */
  const rawStartup = (pool: WirePool, extra: Record<string, string>) =>
    new Promise<string>((resolve, reject) => {
      const s = tcpConnect(pool.port, '127.0.0.1');
      let got = '';
      s.on('data', (c: Buffer) => (got += c.toString('latin1')));
      s.on('error', reject);
      s.on('close', () => resolve(got));
      s.on('connect', () => {
        const all = { user: 'u', database: 'd', options: `pool=${pool.sub}`, ...extra };
        const params = Buffer.from(`${Object.entries(all).map(([k, v]) => `${k}\0${v}\0`).join('')}\0`);
        const head = Buffer.alloc(8);
        head.writeInt32BE(params.length + 8, 0);
        head.writeInt32BE(196608, 4);
        s.write(Buffer.concat([head, params]));
      });
    });

  /** connect → a named query → end(), as an application's short-lived client does; its error events collected. */
  const shortLived = async (errors: string[]) => {
    const c = new pg.Client(w.clientConfig());
    c.on('error', (e: Error & { code?: string }) => errors.push(`${e.code ?? ''} ${e.message}`));
    await c.connect();
    const r = await c.query<{ pid: number }>({ name: 'q1', text: 'select pg_backend_pid() AS pid' });
    await c.end();
    return r.rows[0]!.pid;
  };

  for (const mode of ['session', 'transaction'] as const) {
    t.test(`${mode} mode: ten sequential short-lived clients: no error event, one backend reused`, async (t) => {
      // One server connection allowed: a client that ends waits for nothing, the next one gets the same backend.
      await w.patch({ max_concurrent: 1, settings: { wirePoolMode: mode } });
      await settled();
      const errors: string[] = [];
      const pids = new Set<number>();
      for (let i = 0; i < 10; i++) pids.add(await shortLived(errors));
      t.same(errors, [], 'no client saw an error event');
      t.equal(pids.size, 1, `every client ran on the same server backend (${[...pids].join(', ')})`);
      await settled();
      t.equal(listener().counts().serversOpen, 1, 'one server connection open');
      t.equal(await w.backends(), 1, 'one backend upstream');
      await w.patch({ max_concurrent: 2 });
    });
  }

  t.test('session mode: what a session left behind is reset before the next session gets its connection', async (t) => {
    await w.patch({ settings: { wirePoolMode: 'session' } });
    const a = new pg.Client(w.clientConfig());
    await a.connect();
    await a.query("SET work_mem = '9MB'");
    await a.query('CREATE TEMP TABLE left_behind (n int)');
    await a.query('BEGIN');
    await a.end();
    const b = new pg.Client(w.clientConfig());
    await b.connect();
    const r = await b.query("SELECT current_setting('work_mem') AS mem, to_regclass('pg_temp.left_behind') IS NULL AS gone, now() = statement_timestamp() AS fresh");
    t.same(r.rows[0], { mem: '4MB', gone: true, fresh: true }, 'no setting, no temp table, no open transaction from the session before');
    await b.end();
  });

  t.test('transaction mode: a client that quits inside a transaction: rolled back, connection reused, no error', async (t) => {
    await w.patch({ settings: { wirePoolMode: 'transaction' } });
    await w.direct.query(`CREATE TABLE IF NOT EXISTS quit (n int); GRANT ALL ON quit TO ${w.role}`);
    await settled();
    const before = await w.backends();
    const errors: string[] = [];
    const a = new pg.Client(w.clientConfig());
    a.on('error', (e) => errors.push(e.message));
    await a.connect();
    await a.query('BEGIN');
    await a.query('INSERT INTO quit VALUES (1)');
    await a.end();
    t.same(errors, []);
    t.equal((await w.direct.query('SELECT count(*)::int AS n FROM quit')).rows[0].n, 0, 'the open transaction was rolled back');
    await settled();
    t.equal(await w.backends(), before, 'the server connection was kept for reuse');
  });

  t.test('Terminate sent right behind a statement: the statement still runs and is answered, as on PostgreSQL', async (t) => {
    await w.direct.query(`CREATE TABLE IF NOT EXISTS behind (n int); GRANT ALL ON behind TO ${w.role}`);
    for (const mode of ['session', 'transaction'] as const) {
      await w.patch({ settings: { wirePoolMode: mode } });
      // A raw client: login, then a Query and a Terminate in one write, without waiting for the answer.
      const got = await rawSession(w, [query('INSERT INTO behind SELECT 1 FROM pg_sleep(0.2)'), Buffer.from([0x58, 0, 0, 0, 4])]);
      t.match(got, /INSERT 0 1/, `${mode}: the client got the statement's answer before the close`);
      t.notMatch(got, /08006/, `${mode}: and no error of ours`);
      t.equal((await w.direct.query('SELECT count(*)::int AS n FROM behind')).rows[0].n, 1, `${mode}: the insert committed`);
      await w.direct.query('TRUNCATE behind');
    }
    await settled();
  });

  for (const mode of ['session', 'transaction'] as const) {
    t.test(`${mode} mode: pg_terminate_backend gives the client the server's own 57P01`, async (t) => {
      await w.patch({ settings: { wirePoolMode: mode } });
      const c = new pg.Client(w.clientConfig());
      const events: Array<string | undefined> = [];
      c.on('error', (e: Error & { code?: string }) => events.push(e.code));
      await c.connect();
      const err = await c.query('SELECT pg_terminate_backend(pg_backend_pid())').then(() => null, (e: Error & { code?: string }) => e);
      t.equal(err?.code, '57P01', `the server's error: ${err?.message}`);
      t.match(err?.message, /terminating connection due to administrator command/);
      await c.end().catch(() => {});
      // Inside a transaction, the FATAL comes while the client waits for nothing.
      const d = new pg.Client(w.clientConfig());
      const seen = new Promise<string | undefined>((resolve) => d.on('error', (e: Error & { code?: string }) => resolve(e.code)));
      await d.connect();
      await d.query('BEGIN');
      const pid = (await d.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
      await w.direct.query('SELECT pg_terminate_backend($1)', [pid]);
      t.equal(await seen, '57P01', 'an idle client inside a transaction is told 57P01 too');
      await d.end().catch(() => {});
      await settled();
    });
  }

  t.test('Terminate before the startup packet: closed without a word', async (t) => {
    const bytes = await new Promise<number>((resolve, reject) => {
      const s = tcpConnect(w.port, '127.0.0.1');
      let n = 0;
      s.on('data', (c) => (n += c.length));
      s.on('error', reject);
      s.on('close', () => resolve(n));
      s.on('connect', () => s.write(Buffer.from([0x58, 0, 0, 0, 4])));
    });
    t.equal(bytes, 0, 'nothing was sent back');
    const c = new pg.Client(w.clientConfig());
    const errors: string[] = [];
    c.on('error', (e) => errors.push(e.message));
    // (Its connect() promise never settles, directly against PostgreSQL too: not awaited.)
    void c.connect().catch(() => {});
    // 'end' comes when the connection has closed: any error it raised was emitted before.
    const ended = once(c, 'end');
    await c.end();
    await ended;
    t.same(errors, [], 'node-postgres connect(); end() sees no error');
  });

  t.test('login parameters statement_timeout, lock_timeout, idle_in_transaction_session_timeout, search_path are applied, on every server connection', async (t) => {
    await w.patch({ max_concurrent: 1, settings: { wirePoolMode: 'transaction' } });
    await w.direct.query(`CREATE SCHEMA IF NOT EXISTS mine AUTHORIZATION ${w.role}`);
    const strict = new pg.Client(
      w.clientConfig({ statement_timeout: 150, lock_timeout: 250, idle_in_transaction_session_timeout: 5000, options: `pool=${w.sub} -c search_path=mine,public` } as Partial<pg.ClientConfig>),
    );
    await strict.connect();
    const plain = new pg.Client(w.clientConfig());
    await plain.connect();
    const seen = async (c: pg.Client) =>
      (await c.query("SELECT current_setting('statement_timeout') AS st, current_setting('lock_timeout') AS lt, current_setting('idle_in_transaction_session_timeout') AS it, current_setting('search_path') AS sp, pg_backend_pid() AS pid")).rows[0];
    const pids = new Set<number>();
    for (let i = 0; i < 3; i++) {
      const a = await seen(strict);
      const b = await seen(plain);
      pids.add(a.pid).add(b.pid);
      t.same({ ...a, pid: 0 }, { st: '150ms', lt: '250ms', it: '5s', sp: 'mine,public', pid: 0 }, `round ${i}: the client's own login values`);
      t.same({ ...b, pid: 0 }, { st: '0', lt: '0', it: '0', sp: '"$user", public', pid: 0 }, `round ${i}: the other client has the defaults`);
    }
    t.equal(pids.size, 1, 'both on the one server connection');
    const err = await strict.query('SELECT pg_sleep(2)').then(() => null, (e: Error & { code?: string }) => e);
    t.equal(err?.code, '57014', `the statement timeout given at login bites: ${err?.message}`);
    await strict.query('CREATE TABLE made_here (n int)');
    t.equal((await w.direct.query("SELECT to_regclass('mine.made_here') IS NOT NULL AS there")).rows[0].there, true, 'search_path given at login decides where a table goes');
    await strict.end();
    await plain.end();
    await w.patch({ max_concurrent: 2 });
  });

  t.test('any other login setting (startup parameter, options -c/--name=value) is applied, and pins its client', async (t) => {
    // Two slots for certain (the adaptive limit may have come down after the statement timeouts above).
    await w.patch({ max_concurrent: 2, settings: { wirePoolMode: 'transaction', adaptive: false } });
    const a = new pg.Client(w.clientConfig({ options: `pool=${w.sub} --default_transaction_isolation=serializable -c work_mem=5MB` }));
    await a.connect();
    const b = new pg.Client(w.clientConfig());
    await b.connect();
    const seen = async (c: pg.Client) => (await c.query("SELECT current_setting('default_transaction_isolation') AS iso, current_setting('work_mem') AS mem")).rows[0];
    for (let i = 0; i < 3; i++) {
      t.same(await seen(a), { iso: 'serializable', mem: '5MB' }, `round ${i}: the client has its login settings`);
      t.same(await seen(b), { iso: 'read committed', mem: '4MB' }, `round ${i}: the other client does not`);
    }
    t.equal(w.svc.service.dataplane!.governor.state(w.poolId).inFlight, 1, 'the client with login settings is pinned (holds its slot)');
    await a.query('RESET ALL');
    t.same(await seen(a), { iso: 'serializable', mem: '5MB' }, 'RESET ALL returns to the login values, and the client stays pinned');
    await a.end();
    await b.end();
    const got = await rawStartup(w, { 'bad name!': 'x' });
    t.match(got, /0A000/, 'a startup parameter that is not a setting name is refused');
    const unknown = new pg.Client(w.clientConfig({ options: `pool=${w.sub} -c no_such_setting=1` }));
    unknown.on('error', () => {});
    await unknown.connect();
    const err = await unknown.query('SELECT 1').then(() => null, (e: Error & { code?: string }) => e);
    t.equal(err?.code, '42704', `an unknown setting ends the client with the server's error: ${err?.message}`);
    await unknown.end().catch(() => {});
    await w.patch({ settings: { adaptive: null } });
    await settled();
  });

  t.test('nothing is left held', async (t) => {
    await w.patch({ settings: { wirePoolMode: null } });
    await assertNothingHeld(t, w, 2);
  });
}
