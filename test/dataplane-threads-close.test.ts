// The data plane in two worker threads: close lets each thread's in-flight requests finish and then stops
// its listener; with dataplaneThreadPorts shared every thread is on the one port and the kernel spreads
// the connections over them (and a failed thread is replaced on it); threads with redisUrl are refused.
import t from 'tap';
import { Pool, request } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { until } from './helpers/until.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';

const THREADS = 2;
let origin: Origin;

t.before(async () => {
  origin = await startOrigin();
});
t.teardown(() => origin?.close());

async function get(url: string, host: string): Promise<{ status: number }> {
  const res = await request(`${url}/x`, { headers: { host } });
  await res.body.dump();
  return { status: res.statusCode };
}

t.test('close lets in-flight requests on every thread finish, then stops taking connections', async (t) => {
  // A service of its own: closing it is the test.
  const own = await startTestService({
    overrides: { originCaFile: origin.caFile, dataplaneThreads: THREADS, dataplaneThreadPorts: 'each', accessLogFile: '/dev/null' },
  });
  let closed = false;
  t.teardown(() => (closed ? undefined : own.close()));
  const ownTeam = (await own.bootstrap()).team.id;
  const { rows } = await own.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key)
     VALUES ($1, 'drain', 'drain', 'http', $2, $3, 10, false) RETURNING id`,
    [ownTeam, origin.url, new URL(origin.url).host],
  );
  await own.service.sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await own.service.dataplane!.snapshots.reload();
  const urls = own.service.ports.proxyThreads!.map((p) => `http://127.0.0.1:${p}`);
  for (const url of urls) t.ok(await until(`${url} to serve the pool`, async () => (await get(url, 'drain.pools.localhost')).status === 200), `${url} serves the pool`);
  origin.reset();
  const slow = urls.map((url) => request(`${url}/delay/1500`, { headers: { host: 'drain.pools.localhost' } }).then(async (r) => ({ status: r.statusCode, text: await r.body.text() })));
  t.ok(await until('one slow request per thread', () => origin.active === urls.length), 'one slow request in flight on each thread');
  const closing = own.close();
  closed = true;
  const done = await Promise.all(slow);
  for (const d of done) t.equal(d.status, 200, 'the in-flight request finished');
  await closing;
  for (const url of urls) {
    const refused = await request(`${url}/x`, { headers: { host: 'drain.pools.localhost' } }).then(
      () => false,
      () => true,
    );
    t.ok(refused, `${url} takes no more connections`);
  }
});

t.test('shared port: every thread listens on the one port, the kernel spreads the connections, max_concurrent holds', async (t) => {
  const shared = await startTestService({
    overrides: { originCaFile: origin.caFile, dataplaneThreads: THREADS, dataplaneThreadPorts: 'shared', accessLogFile: '/dev/null', accessLogSample: 0 },
  });
  t.teardown(() => shared.close());
  const ports = shared.service.ports.proxyThreads!;
  t.equal(ports.length, THREADS);
  t.same(ports, Array(THREADS).fill(shared.service.ports.proxy), 'every thread on the proxy port (proxyPort 0: one free port, bound by all)');
  const team = (await shared.bootstrap()).team.id;
  const { rows } = await shared.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, 'one', 'one', 'http', $2, $3, 10, false, '{"adaptive":false,"queueTimeoutMs":60000}'::jsonb) RETURNING id`,
    [team, origin.url, new URL(origin.url).host],
  );
  await shared.service.sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await shared.service.dataplane!.snapshots.reload();
  const url = shared.proxyUrl!;
  t.ok(await until('the pool on the port', async () => (await get(url, 'one.pools.localhost')).status === 200), 'the pool is served on the port');
  // Fresh connections (one per client): the kernel hashes each to one of the listening threads.
  const clients = Array.from({ length: 200 }, () => new Pool(url, { connections: 1 }));
  t.teardown(() => Promise.all(clients.map((c) => c.close())));
  origin.reset();
  const statuses = await Promise.all(
    clients.map(async (c) => {
      const res = await c.request({ path: '/delay/20', method: 'GET', headers: { host: 'one.pools.localhost' } });
      await res.body.dump();
      return res.statusCode;
    }),
  );
  t.equal(statuses.filter((x) => x === 200).length, 200, 'all served');
  t.ok(origin.workingPeak <= 10, `origin peak ${origin.workingPeak} ≤ max_concurrent 10 across the threads`);
  const served = () => shared.service.dataplaneThreads!.served;
  t.ok(await until('every request counted', () => served().reduce((a, b) => a + b, 0) >= 201), 'every request counted');
  t.ok(served().every((n) => n > 0), `every thread served some of them (${served().join(' / ')})`);

  // A thread that fails is replaced on the same port (SO_REUSEPORT): the others serve meanwhile.
  const host = shared.service.dataplaneThreads!;
  host.crashThread(0);
  const during: number[] = [];
  const stop = Date.now() + 15_000;
  // (A request racing the failed thread's close of a kept-alive connection, or queued unaccepted on its
  // listener, is reset: the only failure allowed.)
  while (host.restarts === 0 && Date.now() < stop) during.push(await get(url, 'one.pools.localhost').then((r) => r.status, () => 0));
  t.equal(host.restarts, 1, 'the failed thread was replaced');
  const ok = during.filter((s) => s === 200).length;
  t.ok(during.length > 0 && during.every((s) => s === 200 || s === 0) && ok >= during.length * 0.9, `requests meanwhile: ${ok} of ${during.length} served, the rest reset`);
  t.same(host.ports, Array(THREADS).fill(shared.service.ports.proxy), 'the replacement is on the one port');
  // Fresh connections until one lands on the replacement (it counts from zero once it listens).
  const takes = await until('a connection on the replacement', async () => {
    const c = new Pool(url, { connections: 1 });
    await (await c.request({ path: '/x', method: 'GET', headers: { host: 'one.pools.localhost' } })).body.dump();
    await c.close();
    return served()[0]! > 0;
  }, 10_000);
  t.ok(takes, 'the replacement takes connections on the port');
});

t.test('threads with the Redis governor are refused at start-up (the limits are shared in memory)', async (t) => {
  await t.rejects(
    startTestService({ overrides: { dataplaneThreads: THREADS, dataplaneThreadPorts: 'each', redisUrl: 'redis://127.0.0.1:6379', accessLogFile: '/dev/null' } }),
    /dataplaneThreads above 1 .* cannot be combined with redisUrl/,
  );
});
