// A queue timeout is the governor's time, not the wall clock's (issue 28 §1): the service takes the in-memory
// governor's time and timers (startService's `governorTime`), so a test about a one-minute queue timeout jumps
// over it instead of waiting a minute. Spec: a request that waits in the pool's queue past queueTimeoutMs is
// answered 504 queue_timeout, and one that is still within it keeps its place.
import t from 'tap';
import { Pool } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { DrivenGovernorTime } from './helpers/test-clock.js';
import { until } from './helpers/until.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';

const time = new DrivenGovernorTime();
let origin: Origin;
let svc: TestService;
let proxy: Pool;

t.before(async () => {
  origin = await startOrigin();
  svc = await startTestService({ governorTime: time, overrides: { originCaFile: origin.caFile, accessLogFile: '/dev/null' } });
  proxy = new Pool(svc.proxyUrl!, { connections: 4 });
});
t.teardown(async () => {
  await proxy?.close();
  await svc?.close();
  await origin?.close();
});

t.test('a queued request is refused when the governor time passes queueTimeoutMs, not before', async (t) => {
  const { team } = await svc.bootstrap();
  const { rows } = await svc.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, 'minute', 'minute', 'http', $2, $3, 1, false, $4::jsonb) RETURNING id`,
    [team.id, origin.url, new URL(origin.url).host, JSON.stringify({ queueLength: 2, queueTimeoutMs: 60_000, adaptive: false })],
  );
  const poolId = rows[0]!.id;
  await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${poolId}`);
  await svc.service.dataplane!.snapshots.reload();
  const state = () => svc.service.dataplane!.governor.state(poolId);
  const call = async (path: string) => {
    const res = await proxy.request({ path, method: 'GET', headers: { host: 'minute.pools.localhost' } });
    const body = await res.body.text();
    return { status: res.statusCode, body };
  };

  // A holds the only slot (the origin answers after 2 s of real time); B waits in the queue.
  const a = call('/delay/2000');
  await until('A in flight', () => state().inFlight === 1);
  let bDone = false;
  const b = call('/').finally(() => (bDone = true));
  await until('B queued', () => state().queued === 1);

  time.advance(59_999);
  t.equal(state().queued, 1, 'one millisecond before the timeout, B still waits');
  time.advance(1);
  // At once in real time: the wall clock has not come near the minute.
  await until('B answered', () => bDone, 5000);
  const refused = await b;
  t.equal(refused.status, 504, 'B: refused once the queue timeout has passed');
  t.match(refused.body, /queue_timeout/);
  t.equal(state().queued, 0);
  t.equal((await a).status, 200, 'A is answered');
  await until('the slot is free', () => state().inFlight === 0);
  t.equal(time.pending, 0, 'no governor timer left behind');
});
