// Real backing servers for tests. With CI=true a missing server fails the test run (CI starts them);
// without CI the test is skipped with a one-line reason.
import { connect } from 'node:net';
import type mysql from 'mysql2/promise';
import type { Test } from 'tap';

export const PG_URL = process.env.POOLGATE_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
export const REDIS_URL = process.env.POOLGATE_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';
export const MYSQL = { host: '127.0.0.1', port: 3306, user: 'root', password: '' };

const MYSQL_HOSTS = ['localhost', '127.0.0.1', '%'];

/**
 * A MariaDB database and a user with every right on it and nothing else, dropped when `t` ends. Resolves with
 * the root connection (ended at teardown too) for the test's own setup and checks.
 */
export async function mysqlAccount(t: Test, a: { db: string; user: string; password: string }): Promise<mysql.Connection> {
  // mysql2 loaded here: most test processes import this file for PG_URL alone.
  const { default: mysqlPromise } = await import('mysql2/promise');
  const root = await mysqlPromise.createConnection({ ...MYSQL });
  await root.query(`CREATE DATABASE ${a.db}`);
  for (const h of MYSQL_HOSTS) {
    await root.query(`CREATE USER '${a.user}'@'${h}' IDENTIFIED BY '${a.password}'`);
    await root.query(`GRANT ALL ON ${a.db}.* TO '${a.user}'@'${h}'`);
  }
  t.teardown(async () => {
    await root.query(`DROP DATABASE IF EXISTS ${a.db}`);
    for (const h of MYSQL_HOSTS) await root.query(`DROP USER IF EXISTS '${a.user}'@'${h}'`);
    await root.end();
  });
  return root;
}

const PORTS = { postgres: 5432, redis: 6379, mariadb: 3306 } as const;
export type ServerName = keyof typeof PORTS;

function reachable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port });
    s.setTimeout(1000);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('timeout', () => {
      s.destroy();
      resolve(false);
    });
    s.once('error', () => resolve(false));
  });
}

/** `false` to run the test; a skip reason when the server is absent outside CI. Throws in CI. */
export async function needServer(name: ServerName): Promise<false | string> {
  if (await reachable(PORTS[name])) return false;
  if (process.env.CI) throw new Error(`${name} is not running on 127.0.0.1:${PORTS[name]}; CI requires it`);
  return `${name} is not running on 127.0.0.1:${PORTS[name]}`;
}
