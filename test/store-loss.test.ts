// Issue 27 item 3: the PostgreSQL store SIGKILLed under load and started again, with no restart of poolgate.
// Pool traffic keeps flowing from the data plane's config snapshot; the Control API answers 503 with a clear
// body and Retry-After while the store is away (not 500), and answers again by itself once it is back.
import t from 'tap';
import { request } from 'undici';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { needServer } from './helpers/servers.js';
import { startTestService } from './helpers/service.js';
import { startOrigin } from './helpers/origin.js';
import { startPostgresServer } from './helpers/postgres-server.js';
import { when } from './helpers/failover-load.js';
import { until } from './helpers/until.js';
import { spawnSync } from 'node:child_process';

const skip = (await needServer('postgres')) || (spawnSync('initdb', ['--version']).status === 0 ? false : 'no initdb on this machine');

t.test('the store lost and back under load', { skip }, async (t) => {
  const pg = await startPostgresServer();
  t.teardown(() => pg.stop());
  const origin = await startOrigin();
  t.teardown(() => origin.close());
  const svc = await startTestService({ overrides: { databaseUrl: pg.url, originCaFile: origin.caFile, accessLogFile: '/dev/null' } });
  t.teardown(() => svc.close());
  const { token, team } = await svc.bootstrap();
  const { rows } = await svc.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, 'stored', 'stored', 'http', $2, $3, 4, false, '{}'::jsonb) RETURNING id`,
    [team.id, origin.url, new URL(origin.url).host],
  );
  await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await svc.service.dataplane!.snapshots.reload();
  const pool = async () => {
    const res = await request(`${svc.proxyUrl}/`, { headers: { host: 'stored.pools.localhost' } });
    await res.body.dump();
    return res.statusCode;
  };
  const control = () => svc.api('GET', '/api/v1/pools', { token });
  t.equal(await pool(), 200, 'pool traffic before');
  t.equal((await control()).status, 200, 'Control API before');

  // Paced pool traffic through the outage.
  const statuses: number[] = [];
  let running = true;
  const load = (async () => {
    while (running) {
      statuses.push(await pool().catch(() => 0));
      await new Promise((r) => setTimeout(r, 20));
    }
  })();

  const killedAt = performance.now();
  pg.kill();
  const down = await when(async () => (await control()).status === 503, 10_000);
  t.ok(down, 'the Control API answers 503 while the store is away');
  const res = await control();
  t.equal(res.status, 503);
  t.match(res.body, { message: /store \(PostgreSQL\) cannot be reached/ }, `a clear body: ${JSON.stringify(res.body)}`);
  t.equal(res.headers['retry-after'], '1', 'with Retry-After');
  // Pool traffic during the outage: ten more answers, however long the loaded machine takes to give them.
  const atDown = statuses.length;
  await until('ten pool requests answered while the store is away', () => statuses.length >= atDown + 10);
  const during = statuses.length;
  t.ok(statuses.length > 0 && statuses.every((s) => s === 200), `pool traffic kept flowing from the snapshot (${statuses.length} requests, all 200)`);

  const startedAt = performance.now();
  await pg.start();
  const back = await when(async () => (await control()).status === 200, 20_000);
  t.comment(JSON.stringify({ controlDownAfterMs: down && Math.round(down - killedAt), pgStartMs: Math.round(performance.now() - startedAt), controlBackAfterStartMs: back && Math.round(back - startedAt), poolRequests: statuses.length, poolNon200: statuses.filter((x) => x !== 200).length }));
  t.ok(back, 'the Control API answers again by itself once the store is back');
  running = false;
  await load;
  t.ok(statuses.slice(during).every((s) => s === 200), 'and pool traffic never stopped');
  // A write goes through again (a new key for the pool), without a restart of poolgate.
  const minted = await svc.api('POST', '/api/v1/pools/stored/keys', { token, body: {} });
  t.ok(minted.status >= 200 && minted.status < 300, `writes work again (${minted.status})`);
});
