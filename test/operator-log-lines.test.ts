// Issue 26 item 6: one time format in every line (service lines carried epoch ms, access lines ISO); nothing logged
// about Redis after the governor was closed (a data plane wrote "redis governor lost its connection" after
// "shutdown complete"); wire sessions log their end (duration, bytes, transactions, why) as they log their start.
import t from 'tap';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import mysql from 'mysql2/promise';
import { pino } from 'pino';
import { fromRoot } from '../src/config/paths.js';
import { redisGovernorFromConfig } from '../src/governor/redis.js';
import { prettyLine } from '../src/log.js';
import { startTestService } from './helpers/service.js';
import { needServer, REDIS_URL } from './helpers/servers.js';

t.test('service lines carry ISO time, as access lines do', async (t) => {
  const script = `import(${JSON.stringify(fromRoot('dist', 'src', 'log.js'))}).then((m) => { const l = m.createLogger('info', 'json'); l.info({ event: 'x' }, 'hello'); l.flush(); })`;
  const child = spawn(process.execPath, ['-e', script]);
  let err = '';
  child.stderr.on('data', (c: Buffer) => (err += c));
  await once(child, 'close');
  const line = JSON.parse(err.trim().split('\n')[0]!) as Record<string, unknown>;
  t.match(line.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, 'ISO time, as pino.stdTimeFunctions.isoTime (the access log\'s)');
  t.ok(Math.abs(Date.parse(line.time as string) - Date.now()) < 60_000);
  t.equal(prettyLine(JSON.stringify({ level: 30, time: '2026-01-01T12:00:00.005Z', msg: 'm' })), '12:00:00.005 INFO  m\n', 'the pretty form reads it');
});

t.test('the Redis governor says nothing about its connection once closed', async (t) => {
  const skip = await needServer('redis');
  if (skip) return t.skip(skip);
  const lines: Array<{ level: string; msg: string }> = [];
  const log = { warn: (_o: object, msg: string) => void lines.push({ level: 'warn', msg }), info: (_o: object, msg: string) => void lines.push({ level: 'info', msg }) };
  const gov = await redisGovernorFromConfig({ kind: 'single', url: REDIS_URL }, { governorFailurePolicy: 'closed', governorFailOpenDivisor: 2, governorLeaseTermMs: 10_000 }, log);
  t.match(lines, [{ level: 'info', msg: 'redis governor connected' }]);
  await gov.close();
  // close() returns once ioredis has ended the connection ('end' is its last event: nothing reconnects or
  // reports after it), so what was logged by now is all there will be.
  t.equal(gov.redis.status, 'end', 'the connection has ended');
  t.same(lines.slice(1), [], 'no "lost its connection" after close');
});

t.test('PostgreSQL and MySQL wire sessions log their end: duration, bytes, transactions, reason', async (t) => {
  for (const s of ['postgres', 'mariadb'] as const) {
    const skip = await needServer(s);
    if (skip) return t.skip(skip);
  }
  const lines: Array<Record<string, any>> = [];
  const log = pino({ level: 'info' }, { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, any>) });
  const svc = await startTestService({ overrides: { dbAllowInsecure: true, accessLogSample: 1, accessLogFile: '/dev/null' }, log });
  t.teardown(() => svc.close());
  const { token } = await svc.bootstrap();
  const pool = async (body: Record<string, unknown>, username: string) => {
    const sub = (await svc.api('POST', '/api/v1/pools/database', { token, body })).body.data.subdomain as string;
    await svc.api('PUT', `/api/v1/pools/${sub}/credential`, { token, body: { method: 'postgres_role', username } });
    return { sub, key: (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token })).body.data.key as string };
  };
  const pgPool = await pool({ backend: 'postgres', db_host: '127.0.0.1', db_port: 5432, db_name: 'postgres' }, 'postgres');
  const myPool = await pool({ backend: 'mysql', db_host: '127.0.0.1', db_port: 3306, db_name: 'mysql' }, 'root');
  await svc.service.dataplane!.snapshots.reload();

  const c = new pg.Client({ host: '127.0.0.1', port: svc.service.ports.pg!, user: pgPool.sub, database: 'postgres', password: pgPool.key });
  await c.connect();
  await c.query('SELECT 1');
  await c.query('BEGIN');
  await c.query('SELECT 2');
  await c.query('COMMIT');
  // What the client's socket received, to hold the logged bytes out against (writes that bypass socket.write
  // must be counted too).
  const pgSocket = (c as unknown as { connection: { stream: { bytesRead: number } } }).connection.stream;
  await c.end();
  const m = await mysql.createConnection({ host: '127.0.0.1', port: svc.service.ports.mysql!, user: myPool.sub, password: myPool.key });
  await m.query('SELECT 1');
  await m.query('SELECT 2');
  const mySocket = (m as unknown as { connection: { stream: { bytesRead: number } } }).connection.stream;
  await m.end();

  const ended = async (event: string) => {
    for (let i = 0; i < 100 && !lines.some((l) => l.event === event && l.outcome === 'session_end'); i++) await sleep(50);
    return lines.find((l) => l.event === event && l.outcome === 'session_end');
  };
  const pgEnd = await ended('pgwire');
  t.ok(lines.some((l) => l.event === 'pgwire' && l.outcome === 'login'), 'the start was logged');
  t.match(pgEnd, { level: 30, pool: pgPool.sub, user: pgPool.sub, reason: 'client_terminated', transactions: 2, durationMs: Number }, 'psql-like session: SELECT 1, then one BEGIN…COMMIT');
  t.ok(pgEnd?.bytesIn > 0 && pgEnd?.bytesOut > pgEnd?.bytesIn, `bytes in and out (${pgEnd?.bytesIn}, ${pgEnd?.bytesOut})`);
  t.equal(pgEnd?.bytesOut, pgSocket.bytesRead, `bytes out: every byte the client received (${pgEnd?.bytesOut}, ${pgSocket.bytesRead})`);
  t.match(pgEnd?.msg, /^pgwire: session on pool .* ended \(client_terminated\) after \d+\.\d s, 2 transactions, \d+ bytes in, \d+ bytes out$/);

  const myEnd = await ended('mysqlwire');
  t.match(myEnd, { level: 30, pool: myPool.sub, reason: 'client_terminated', transactions: 2, durationMs: Number });
  t.ok(myEnd?.bytesIn > 0 && myEnd?.bytesOut > 0);
  t.equal(myEnd?.bytesOut, mySocket.bytesRead, `bytes out: every byte the client received (${myEnd?.bytesOut}, ${mySocket.bytesRead})`);

  // A client that just goes away (no Terminate) is logged as such.
  const gone = new pg.Client({ host: '127.0.0.1', port: svc.service.ports.pg!, user: pgPool.sub, database: 'postgres', password: pgPool.key });
  gone.on('error', () => {});
  await gone.connect();
  (gone as unknown as { connection: { stream: { destroy(): void } } }).connection.stream.destroy();
  for (let i = 0; i < 100 && lines.filter((l) => l.outcome === 'session_end' && l.event === 'pgwire').length < 2; i++) await sleep(50);
  t.match(lines.filter((l) => l.outcome === 'session_end' && l.event === 'pgwire')[1], { reason: 'client_disconnected', transactions: 0 });
  t.notOk(JSON.stringify(lines).includes(pgPool.key), 'never the key');
});
