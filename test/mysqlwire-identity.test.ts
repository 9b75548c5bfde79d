// What the MySQL listener's greeting announces (config mysqlServerVersion, src/db/mysqlwire/server-identity.ts):
// the policy over the pools' servers, then the explicit setting through a real service, MariaDB and mysql2.
import t from 'tap';
import mysql from 'mysql2/promise';
import { createLogger } from '../src/log.js';
import type { PoolEntry, Snapshot, SnapshotFeed } from '../src/pool-request/snapshot.js';
import { FALLBACK_VERSION, GREETING_WAIT_MS, ServerIdentity, type Learned } from '../src/db/mysqlwire/server-identity.js';
import { CLIENT, MARIADB } from '../src/db/mysqlwire/packets.js';
import { MYSQL, needServer } from './helpers/servers.js';
import { wirePool } from './helpers/mysql-wire.js';
import { until } from './helpers/until.js';

const log = createLogger('silent');

function pool(id: number, host: string, backend: 'mysql' | 'postgres' = 'mysql'): PoolEntry {
  return {
    id,
    subdomain: `p${id}`,
    backend,
    status: 'active',
    database: { host, port: 3306, name: 'db', sslmode: 'require' },
    credential: { method: 'postgres_role', username: 'u', password: 'p' },
  } as unknown as PoolEntry;
}

/** A feed whose snapshot the test replaces. */
function feed(pools: PoolEntry[]): SnapshotFeed & { set(p: PoolEntry[]): void } {
  const make = (p: PoolEntry[]) => ({ pools: new Map(p.map((x) => [x.subdomain, x])), keys: new Map(), budgets: [], loadedAt: 0, keyEdits: 0 }) as Snapshot;
  let current = make(pools);
  return {
    get current() {
      return current;
    },
    set(p) {
      current = make(p);
    },
    start: async () => {},
    reload: async () => {},
    close: async () => {},
  };
}

const MARIA_11 = { version: '5.5.5-11.4.2-MariaDB', capabilities: 0xf7fffffe, mariadbCapabilities: 0x1f };
const MARIA_10 = { version: '5.5.5-10.11.6-MariaDB-log', capabilities: 0xf7fffffe, mariadbCapabilities: MARIADB.EXTENDED_METADATA | 0x1 };
const MYSQL_8 = { version: '8.0.39', capabilities: 0xffffffff, mariadbCapabilities: 0 };
const MYSQL_56 = { version: '5.6.51', capabilities: 0x7fffff & ~CLIENT.SESSION_TRACK, mariadbCapabilities: 0 };

/** An identity whose probes answer from `answers` by host (a host not in it never answers). */
function identity(setting: string, pools: PoolEntry[], answers: Record<string, Learned>) {
  const f = feed(pools);
  const probed: string[] = [];
  const id = new ServerIdentity({
    setting,
    snapshots: f,
    log,
    probe: (p) => {
      probed.push(p.database!.host);
      const a = answers[p.database!.host];
      return a ? Promise.resolve(a) : new Promise<Learned>(() => {});
    },
  });
  t.teardown(() => id.close());
  return { id, f, probed };
}

t.test('auto: the pools\' servers are probed; same engine announces the oldest version and the MariaDB capabilities all offer', async (t) => {
  const { id, probed } = identity('auto', [pool(1, 'a'), pool(2, 'b'), pool(3, 'a'), pool(4, 'pg', 'postgres')], { a: MARIA_11, b: MARIA_10 });
  t.ok((await id.greeting()).version.includes('MariaDB'), 'the first answer ends the wait');
  // Both probes answered at once: the greeting changes when the second answer is learned.
  const both = { version: MARIA_10.version, capabilities: CLIENT.SESSION_TRACK, mariadbCapabilities: MARIADB.EXTENDED_METADATA };
  await until('both answers learned', () => JSON.stringify(id.greeting()) === JSON.stringify(both));
  t.same(probed.sort(), ['a', 'b'], 'one probe per MySQL server');
  t.same(id.greeting(), both, 'oldest version; only the capabilities poolgate passes through (bulk operations only where every server offers them)');
});

t.test('auto: servers of different engines announce the fallback and no MariaDB capability', async (t) => {
  const { id } = identity('auto', [pool(1, 'a'), pool(2, 'm')], { a: MARIA_11, m: MYSQL_8 });
  await id.greeting();
  await until('both answers learned', () => (id.greeting() as { version?: string }).version === FALLBACK_VERSION);
  t.same(id.greeting(), { version: FALLBACK_VERSION, capabilities: CLIENT.SESSION_TRACK, mariadbCapabilities: 0 });
});

t.test('a capability is offered only when every server offers it (session tracking, which MySQL 5.6 lacks)', async (t) => {
  const { id } = identity('auto', [pool(1, 'a'), pool(2, 'old')], { a: MYSQL_8, old: MYSQL_56 });
  await id.greeting();
  await until('both answers learned', () => (id.greeting() as { version?: string }).version === MYSQL_56.version);
  t.same(id.greeting(), { version: MYSQL_56.version, capabilities: 0, mariadbCapabilities: 0 });
});

t.test('a greeting never waits longer than GREETING_WAIT_MS for a server that does not answer', async (t) => {
  const { id } = identity('auto', [pool(1, 'silent')], {});
  const started = Date.now();
  const g = await id.greeting();
  const ms = Date.now() - started;
  t.same(g, { version: FALLBACK_VERSION, capabilities: 0, mariadbCapabilities: 0 });
  t.ok(ms >= GREETING_WAIT_MS - 50 && ms < GREETING_WAIT_MS + 1000, `waited ${ms} ms`);
  t.same(id.greeting(), { version: FALLBACK_VERSION, capabilities: 0, mariadbCapabilities: 0 }, 'while nothing is learned and the probe still runs: at once');
});

t.test('a server no pool points at any more stops counting; an explicit setting keeps its text and still learns capabilities', async (t) => {
  const { id, f } = identity('auto', [pool(1, 'a'), pool(2, 'm')], { a: MARIA_11, m: MYSQL_8 });
  await id.greeting();
  await until('both answers learned', () => (id.greeting() as { version?: string }).version === FALLBACK_VERSION);
  t.equal((id.greeting() as { version: string }).version, FALLBACK_VERSION);
  f.set([pool(1, 'a')]);
  t.same(id.greeting(), { version: MARIA_11.version, capabilities: CLIENT.SESSION_TRACK, mariadbCapabilities: MARIADB.EXTENDED_METADATA | MARIADB.STMT_BULK_OPERATIONS }, 'the MySQL pool is gone');
  const fixed = identity('9.1.0-custom', [pool(1, 'a')], { a: MARIA_11 });
  t.same(await fixed.id.greeting(), { version: '9.1.0-custom', capabilities: CLIENT.SESSION_TRACK, mariadbCapabilities: MARIADB.EXTENDED_METADATA | MARIADB.STMT_BULK_OPERATIONS });
});

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  t.test('mysqlServerVersion set: mysql2 sees that version, and JSON columns still arrive parsed', async (t) => {
    const w = await wirePool(t, { overrides: { mysqlServerVersion: '8.0.99-explicit' } });
    const direct = await mysql.createConnection({ ...MYSQL, database: w.db });
    t.teardown(() => direct.end());
    await direct.query('CREATE TABLE j (doc JSON)');
    await direct.query(`INSERT INTO j VALUES ('[1,2]')`);
    const c = await w.connect();
    t.equal((c as any).connection._handshakePacket.serverVersion, '8.0.99-explicit');
    const [[row]] = (await c.query('SELECT doc FROM j')) as any;
    t.same(row.doc, [1, 2]);
    const [[v]] = (await c.query('SELECT VERSION() AS v')) as any;
    t.match(v.v, /MariaDB/, "VERSION() is still the server's");
    await c.end();
  });
}
