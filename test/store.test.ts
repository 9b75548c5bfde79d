// The store on both engines (embedded PGlite and PostgreSQL): migrations, transactions, the change feed,
// sealed secrets at rest, a clean restart of the embedded default, and the data directory lock.
import t from 'tap';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { openStore } from '../src/store/open.js';
import { migrate } from '../src/store/migrate.js';
import type { Sql } from '../src/store/sql.js';
import { acquireDataDirLock, dataDirOwner } from '../src/store/data-dir-lock.js';
import { loadMasterKey, parseMasterKey, SecretBox } from '../src/security/secret-box.js';
import { createCredential, openCredential } from '../src/store/credentials.js';
import { fromRoot } from '../src/config/paths.js';
import { startTestService } from './helpers/service.js';
import { freshPostgresDatabase } from './helpers/postgres-database.js';
import { needServer } from './helpers/servers.js';
import { seedPgliteDataDir } from './helpers/pglite-template.js';
import { until } from './helpers/until.js';

const MIGRATIONS = readdirSync(fromRoot('src', 'store', 'migrations'))
  .filter((f) => f.endsWith('.sql'))
  .map((f) => f.replace(/\.sql$/, ''))
  .sort();

interface EngineUnderTest {
  open(): Promise<Sql>;
  /** Where a second process would connect (PostgreSQL only). */
  url: string | null;
  dataDir: string;
  cleanup(): Promise<void>;
}

async function engine(name: 'pglite' | 'postgres'): Promise<EngineUnderTest> {
  const dataDir = mkdtempSync(join(tmpdir(), 'poolgate-store-'));
  const db = name === 'postgres' ? await freshPostgresDatabase() : null;
  return {
    open: () => openStore({ databaseUrl: db?.url ?? null, dataDir }),
    url: db?.url ?? null,
    dataDir,
    async cleanup() {
      await db?.drop();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}


/** Every file under dir, read as bytes. */
function filesUnder(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => join(e.parentPath, e.name));
}

const pgSkip = await needServer('postgres');

for (const name of ['pglite', 'postgres'] as const) {
  t.test(`${name} store`, { skip: name === 'postgres' ? pgSkip : false }, async (t) => {
    const e = await engine(name);
    t.teardown(() => e.cleanup());
    let sql = await e.open();
    t.teardown(() => sql.close().catch(() => {}));
    t.equal(sql.engine, name);

    t.test('migrations apply once, and re-opening applies nothing and keeps the data', async (t) => {
      const versions = (await sql.query<{ version: string }>('SELECT version FROM schema_migrations ORDER BY version')).rows.map((r) => r.version);
      t.same(versions, MIGRATIONS, 'every migration recorded exactly once');
      t.same(await migrate(sql), [], 'migrating an up-to-date store applies nothing');
      await sql.query(`INSERT INTO teams (name, slug) VALUES ('Kept', 'kept-${name}')`);
      await sql.close();
      sql = await e.open();
      t.same((await sql.query<{ version: string }>('SELECT version FROM schema_migrations ORDER BY version')).rows.map((r) => r.version), MIGRATIONS);
      t.equal((await sql.query(`SELECT 1 FROM teams WHERE slug = 'kept-${name}'`)).rowCount, 1, 'rows survive a re-open');
    });

    if (name === 'postgres') {
      t.test('processes migrating one fresh PostgreSQL database at once apply each migration once', async (t) => {
        const fresh = await freshPostgresDatabase();
        t.teardown(() => fresh.drop());
        const opened = await Promise.all([1, 2, 3].map(() => openStore({ databaseUrl: fresh.url, dataDir: e.dataDir })));
        const { rows } = await opened[0]!.query<{ version: string; n: number }>('SELECT version, count(*)::int AS n FROM schema_migrations GROUP BY version ORDER BY version');
        t.same(rows.map((r) => r.version), MIGRATIONS);
        t.ok(rows.every((r) => r.n === 1));
        await Promise.all(opened.map((s) => s.close()));
      });
    }

    t.test('a transaction commits whole, and rolls back whole on a throw or a failed statement', async (t) => {
      await sql.exec('CREATE TABLE IF NOT EXISTS store_test (id integer PRIMARY KEY, v text NOT NULL)');
      const out = await sql.transaction(async (tx) => {
        await tx.query('INSERT INTO store_test VALUES (1, $1)', ['one']);
        await tx.query('INSERT INTO store_test VALUES (2, $1)', ['two']);
        return 'done';
      });
      t.equal(out, 'done', 'the transaction returns what its function returns');
      t.equal((await sql.query('SELECT * FROM store_test')).rowCount, 2);

      await t.rejects(
        sql.transaction(async (tx) => {
          await tx.query('INSERT INTO store_test VALUES (3, $1)', ['three']);
          await tx.query('UPDATE store_test SET v = $1 WHERE id = 1', ['changed']);
          throw new Error('boom');
        }),
        { message: 'boom' },
      );
      await t.rejects(
        sql.transaction(async (tx) => {
          await tx.query('INSERT INTO store_test VALUES (4, $1)', ['four']);
          await tx.query('INSERT INTO store_test VALUES (1, $1)', ['duplicate']);
        }),
        { code: '23505' },
      );
      const { rows } = await sql.query<{ id: number; v: string }>('SELECT id, v FROM store_test ORDER BY id');
      t.same(rows, [{ id: 1, v: 'one' }, { id: 2, v: 'two' }], 'nothing of either failed transaction remains');
      t.equal((await sql.query('SELECT 1')).rowCount, 1, 'the store is usable after a rollback');
    });

    t.test('listen/notify delivers payloads in order, and unsubscribing stops them', async (t) => {
      const got: string[] = [];
      const unlisten = await sql.listen('store_test_chan', (p) => got.push(p));
      const payloads = ['pool:1', 'key:7', 'ünïcode ✓ "quoted" \'single\'', ''];
      for (const p of payloads) await sql.notify('store_test_chan', p);
      t.ok(await until('every payload', () => got.length >= payloads.length, 3000), `received ${got.length}`);
      t.same(got, payloads);
      if (e.url) {
        // The change feed crosses processes: a notification from another connection arrives too.
        const other = new pg.Client({ connectionString: e.url });
        await other.connect();
        await other.query(`SELECT pg_notify('store_test_chan', 'from-another-connection')`);
        await other.end();
        t.ok(await until('the other connection\'s notification', () => got.includes('from-another-connection'), 3000), 'a notification from another connection arrives');
      }
      await unlisten();
      const seen = got.length;
      // A listener still subscribed proves the notification was delivered before the unsubscribed one is judged.
      const still: string[] = [];
      const unlistenStill = await sql.listen('store_test_chan', (p) => still.push(p));
      await sql.notify('store_test_chan', 'after-unlisten');
      await until('the notification at a listener still subscribed', () => still.includes('after-unlisten'));
      await unlistenStill();
      t.equal(got.length, seen, 'nothing arrives after unsubscribing');
    });

    t.test('sealed secrets round-trip and are not stored as plaintext', async (t) => {
      const box = new SecretBox(loadMasterKey(null, e.dataDir));
      const team = (await sql.query<{ id: number }>(`INSERT INTO teams (name, slug) VALUES ('Sealed', 'sealed-${name}') RETURNING id`)).rows[0]!;
      const secret = `sk_live_${randomBytes(12).toString('hex')}`;
      const visible = `visible_${randomBytes(12).toString('hex')}`;
      const row = await createCredential(sql, box, team.id, visible, { method: 'bearer_static', token: secret });
      const stored = (await sql.query<{ secret_enc: string }>('SELECT secret_enc FROM credentials WHERE id = $1', [row.id])).rows[0]!.secret_enc;
      t.notMatch(stored, secret, 'the column holds ciphertext');
      t.notMatch(stored, Buffer.from(secret).toString('base64'), 'not merely encoded');
      t.same(openCredential(box, { secret_enc: stored }), { method: 'bearer_static', token: secret }, 'the master key opens it');
      t.throws(() => new SecretBox(randomBytes(32)).open(stored), 'another key cannot open it');
      if (name === 'pglite') {
        // At rest means on disk: after a close, the visible name is in the data files and the secret is not.
        await sql.close();
        const files = filesUnder(join(e.dataDir, 'pglite'));
        const holds = (needle: string) => files.some((f) => readFileSync(f).includes(Buffer.from(needle)));
        t.ok(holds(visible), 'the scan sees plaintext columns (control)');
        t.notOk(holds(secret), 'the secret appears in no file of the data directory');
        sql = await e.open();
        const again = (await sql.query<{ secret_enc: string }>('SELECT secret_enc FROM credentials WHERE id = $1', [row.id])).rows[0]!;
        t.equal(openCredential(box, again).method, 'bearer_static', 'it opens again after a re-open');
      }
    });
  });
}

t.test('SecretBox: AES-256-GCM with a random IV; tampering and bad keys are refused', async (t) => {
  const box = new SecretBox(randomBytes(32));
  const text = 'pässwörd 🔑 with "quotes"';
  const a = box.seal(text);
  const b = box.seal(text);
  t.not(a, b, 'sealing twice gives two ciphertexts');
  t.equal(box.open(a), text);
  const [v, iv, tag, body] = a.split(':');
  const flipped = Buffer.from(body!, 'base64');
  flipped[0] = flipped[0]! ^ 1;
  t.throws(() => box.open([v, iv, tag, flipped.toString('base64')].join(':')), 'a flipped ciphertext bit is detected');
  t.throws(() => box.open('v0:x:y:z'), /unknown format/);
  t.throws(() => new SecretBox(randomBytes(16)), /32 bytes/);
  t.throws(() => parseMasterKey('abcd'), /POOLGATE_SECRET_KEY/);
  t.equal(parseMasterKey(randomBytes(32).toString('hex')).length, 32, '64 hex digits');
  t.equal(parseMasterKey(randomBytes(32).toString('base64')).length, 32, 'base64');
});

t.test('the generated master key is mode 0600 and stable across loads', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-key-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const k1 = loadMasterKey(null, dir);
  t.equal(statSync(join(dir, 'secret.key')).mode & 0o777, 0o600);
  t.same(loadMasterKey(null, dir), k1);
  const configured = randomBytes(32).toString('hex');
  t.same(loadMasterKey(configured, dir), Buffer.from(configured, 'hex'), 'a configured key wins');
});

t.test('nothing written is lost on a clean restart of the embedded default', async (t) => {
  const dataDir = mkdtempSync(join(tmpdir(), 'poolgate-restart-'));
  t.teardown(() => rmSync(dataDir, { recursive: true, force: true }));
  // Migrated already (the run's template): what is tested is the restart, not the first start.
  await seedPgliteDataDir(dataDir);
  const first = await startTestService({ dataDir });
  const boot = await first.bootstrap({ team: 'Restart' });
  const pool = (
    await first.service.sql.query<{ id: number; subdomain: string }>(
      `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host) VALUES ($1, 'r', 'restart-r1', 'http', 'https://r.example.test', 'r.example.test') RETURNING id, subdomain`,
      [boot.team.id],
    )
  ).rows[0]!;
  const minted = await first.api('POST', `/api/v1/pools/${pool.subdomain}/keys`, { token: boot.token, body: { label: 'survivor' } });
  t.equal(minted.status, 201);
  // A burst of writes right before the stop: each one acknowledged must be there after the restart.
  const tokens = await Promise.all(Array.from({ length: 20 }, (_, i) => first.admin(['token', 'create', '--team', boot.team.slug, '--user', String(boot.user.id), '--name', `burst-${i}`])));
  const cred = await createCredential(first.service.sql, first.service.box, boot.team.id, 'restart-cred', { method: 'bearer_static', token: 'restart-secret' });
  await first.close();
  t.notOk(existsSync(join(dataDir, 'poolgate.pid')), 'the data dir lock is released on close');

  const second = await startTestService({ dataDir });
  t.teardown(() => second.close());
  t.equal((await second.api('GET', '/api/v1/me', { token: boot.token })).status, 200, 'the bootstrap token still works');
  for (const tok of tokens) t.equal((await second.api('GET', '/api/v1/me', { token: tok.token })).status, 200, `token ${tok.name} survived`);
  t.equal((await second.api('GET', `/api/v1/pools/${pool.subdomain}`, { token: boot.token })).status, 200);
  const keys = (await second.service.sql.query<{ id: number; label: string }>('SELECT id, label FROM pool_keys WHERE pool_id = $1', [pool.id])).rows;
  t.same(keys, [{ id: minted.body.data.id, label: 'survivor' }]);
  const row = (await second.service.sql.query<{ secret_enc: string }>('SELECT secret_enc FROM credentials WHERE id = $1', [cred.id])).rows[0]!;
  t.same(openCredential(second.service.box, row), { method: 'bearer_static', token: 'restart-secret' }, 'the generated master key is reused');
});

t.test('the data directory lock refuses a second process and clears a stale pid file', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-lock-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const lockModule = new URL('../src/store/data-dir-lock.js', import.meta.url).href;
  const child = spawn(
    process.execPath,
    ['--input-type=module', '-e', `const m = await import(${JSON.stringify(lockModule)}); m.acquireDataDirLock(process.argv[1]); console.log('locked'); setInterval(() => {}, 1000);`, dir],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  t.teardown(() => child.kill('SIGKILL'));
  const [line] = (await once(child.stdout!, 'data')) as [Buffer];
  t.equal(line.toString().trim(), 'locked');

  t.equal(dataDirOwner(dir), child.pid, 'the owner is the other process');
  t.throws(() => acquireDataDirLock(dir), new RegExp(`in use by poolgate process ${child.pid}`));
  await t.rejects(startTestService({ dataDir: dir }), /in use by poolgate process/, 'a service refuses to start on it');

  child.kill('SIGKILL');
  await once(child, 'exit');
  t.equal(readFileSync(join(dir, 'poolgate.pid'), 'utf8').trim(), String(child.pid), 'a killed process leaves its pid file');
  t.equal(dataDirOwner(dir), null, 'a dead owner is no owner');
  const lock = acquireDataDirLock(dir);
  t.equal(readFileSync(join(dir, 'poolgate.pid'), 'utf8').trim(), String(process.pid), 'the stale pid file was replaced');
  lock.release();
  t.notOk(existsSync(join(dir, 'poolgate.pid')), 'release removes the pid file');

  writeFileSync(join(dir, 'poolgate.pid'), 'not a pid\n');
  const again = acquireDataDirLock(dir);
  again.release();
  t.pass('a garbage pid file is treated as stale');
});

t.test('a start that fails after the store opened frees the data directory (here: an unreadable master key)', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-badkey-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  await seedPgliteDataDir(dir);
  writeFileSync(join(dir, 'secret.key'), 'not a key\n', { mode: 0o600 });
  await t.rejects(startTestService({ dataDir: dir }), /POOLGATE_SECRET_KEY must be 32 bytes/, 'the bad key refuses the start');
  t.notOk(existsSync(join(dir, 'poolgate.pid')), 'the data dir lock was released');
  t.equal(dataDirOwner(dir), null, 'no process owns the data dir');
});
