// The data plane under load, through the real listener and a real https origin: the concurrency cap
// holds under 500 concurrent clients, 200 MB bodies (soak run; 120 MB in the default suite) stream both ways with flat memory, client aborts
// release their slot once the origin is done with the request, and 20,000 mixed requests (soak run; 2,000 in the default
// suite) leave no slot behind.
import t from 'tap';
import { Readable } from 'node:stream';
import { Pool } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { churn } from './helpers/churn.js';
import { soak } from './helpers/soak.js';
import { until } from './helpers/until.js';

/** Requests of the churn test: 20,000 in the soak run (test/soak/), 2,000 in the default suite. */
const CHURN_TOTAL = soak(20_000, 2_000);
/** Body size of the streaming test: 200 MB in the soak run, 120 MB here (still well above the 80 MB growth allowed). */
const STREAM_MB = soak(200, 120);
// Every wait below is an `until` on a state or a request's own timeout; the file's limit only catches a hang.
// ~48 s beside one other file at load average 10 (the streaming 22 s, the churn 11 s); at 15-19 the file ran
// past tap's default 120 s.
t.setTimeout(soak(1_800_000, 300_000));

let origin: Origin;
let svc: TestService;
let teamId: number;

t.before(async () => {
  origin = await startOrigin();
  svc = await startTestService({ overrides: { originCaFile: origin.caFile, accessLogSample: 0, accessLogFile: '/dev/null' } });
  teamId = (await svc.bootstrap()).team.id;
});
t.teardown(async () => {
  await svc?.close();
  await origin?.close();
});

const dp = () => svc.service.dataplane!;
const proxyUrl = () => svc.proxyUrl!;

async function createPool(sub: string, maxConcurrent: number, settings: Record<string, unknown> = {}): Promise<number> {
  const { rows } = await svc.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, $2, $2, 'http', $3, $4, $5, false, $6::jsonb) RETURNING id`,
    [teamId, sub, origin.url, new URL(origin.url).host, maxConcurrent, JSON.stringify(settings)],
  );
  await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await dp().snapshots.reload();
  return rows[0]!.id;
}

/** Peak RSS growth (MB) over a baseline while fn runs, sampled every 20 ms. */
async function rssGrowth(fn: () => Promise<void>): Promise<number> {
  global.gc?.();
  const base = process.memoryUsage.rss();
  let peak = base;
  const timer = setInterval(() => {
    peak = Math.max(peak, process.memoryUsage.rss());
  }, 20);
  try {
    await fn();
  } finally {
    clearInterval(timer);
  }
  return (Math.max(peak, process.memoryUsage.rss()) - base) / 1024 / 1024;
}

t.test('max_concurrent holds under 500 concurrent clients; every one is served from the queue', async (t) => {
  const poolId = await createPool('crowd', 10, { queueTimeoutMs: 60_000 });
  const client = new Pool(proxyUrl(), { connections: 500 });
  t.teardown(() => client.close());
  origin.reset();
  const statuses = await Promise.all(
    Array.from({ length: 500 }, async () => {
      const res = await client.request({ path: '/delay/20', method: 'GET', headers: { host: 'crowd.pools.localhost' } });
      await res.body.dump();
      return res.statusCode;
    }),
  );
  t.equal(statuses.filter((s) => s === 200).length, 500, 'all 500 served');
  t.equal(origin.count, 500);
  t.ok(origin.peak <= 10, `origin peak concurrency ${origin.peak} ≤ max_concurrent 10`);
  t.equal(origin.peak, 10, 'and the pool used all of its slots');
  t.same(dp().governor.state(poolId).inFlight, 0);
  t.same(dp().governor.state(poolId).queued, 0);
});

t.test(`${STREAM_MB} MB download and upload stream through with flat memory`, async (t) => {
  await createPool('stream', 4, { requestTimeoutMs: 120_000 });
  const client = new Pool(proxyUrl(), { connections: 2 });
  t.teardown(() => client.close());
  const SIZE = STREAM_MB * 1024 * 1024;
  // A body held whole would add at least its own size (120 MB; 200 in the soak run); streamed, the growth is the
  // working set of three peers in this one process (V8's young generation, socket buffers): 40-84 MB seen on Node 24
  // under load. The bound sits between the two.
  const FLAT_MB = 100;

  // Warm-up: the first megabytes grow V8's young generation and the sockets' buffers to their working size, which
  // does not grow with the body (Node 24 grows its young generation further than Node 20 did: ~35 MB more RSS
  // for the first large transfer). What the 120 MB add on top of that is the figure.
  for (const path of [`/download/${16 * 1024 * 1024}`, `/download/${16 * 1024 * 1024}?chunked=1`]) {
    const res = await client.request({ path, method: 'GET', headers: { host: 'stream.pools.localhost' } });
    for await (const chunk of res.body) void chunk;
  }

  let received = 0;
  const down = await rssGrowth(async () => {
    const res = await client.request({ path: `/download/${SIZE}`, method: 'GET', headers: { host: 'stream.pools.localhost' } });
    t.equal(res.headers['content-length'], String(SIZE));
    for await (const chunk of res.body) received += (chunk as Buffer).length;
  });
  t.equal(received, SIZE, 'every byte downloaded');
  t.ok(down < FLAT_MB, `download RSS growth ${down.toFixed(1)} MB`);

  let chunkedReceived = 0;
  const downChunked = await rssGrowth(async () => {
    const res = await client.request({ path: `/download/${SIZE}?chunked=1`, method: 'GET', headers: { host: 'stream.pools.localhost' } });
    for await (const chunk of res.body) chunkedReceived += (chunk as Buffer).length;
  });
  t.equal(chunkedReceived, SIZE, 'every byte of a body without a length');
  t.ok(downChunked < FLAT_MB, `chunked download RSS growth ${downChunked.toFixed(1)} MB`);

  const piece = Buffer.alloc(64 * 1024, 0x62);
  let echoed: any;
  const up = await rssGrowth(async () => {
    let sent = 0;
    const body = new Readable({
      read() {
        if (sent >= SIZE) return void this.push(null);
        sent += piece.length;
        this.push(piece);
      },
    });
    const res = await client.request({
      path: '/upload',
      method: 'POST',
      headers: { host: 'stream.pools.localhost', 'content-length': String(SIZE), 'content-type': 'application/octet-stream' },
      body,
    });
    echoed = await res.body.json();
  });
  t.equal(echoed.bodyBytes, SIZE, 'the origin received every byte');
  t.ok(up < FLAT_MB, `upload RSS growth ${up.toFixed(1)} MB`);
  t.comment(`RSS growth: download ${down.toFixed(1)} MB, chunked download ${downChunked.toFixed(1)} MB, upload ${up.toFixed(1)} MB`);
});

t.test('a client that disconnects releases its slot once the origin is done with its request (issue 25 item 8)', async (t) => {
  const poolId = await createPool('quitter', 1);
  const client = new Pool(proxyUrl(), { connections: 4 });
  t.teardown(() => client.close());
  origin.reset();
  const ac = new AbortController();
  const p = client.request({ path: '/delay/1500', method: 'GET', headers: { host: 'quitter.pools.localhost' }, signal: ac.signal }).catch((e: Error) => e);
  await until('the origin to work on it', () => origin.active === 1);
  t.equal(dp().governor.state(poolId).inFlight, 1);
  ac.abort();
  t.type(await p, Error);
  // The origin is still serving it: a freed slot would let the origin see max_concurrent + 1. Watched for the
  // whole time the origin works on it (not a fixed sleep): the slot stays taken until the origin is done.
  let freedEarly = 0;
  let watched = 0;
  await until('the origin to finish the abandoned request', () => {
    const working = origin.active === 1;
    const taken = dp().governor.state(poolId).inFlight === 1;
    if (working) watched++;
    if (working && !taken) freedEarly++;
    return !working;
  });
  t.ok(watched > 1, `the slot was watched while the origin worked (${watched} looks)`);
  t.equal(freedEarly, 0, 'the slot stayed taken while the origin worked on the abandoned request');
  await until('the slot to be released', () => dp().governor.state(poolId).inFlight === 0);
  // Released once: the pool's one slot is free again, exactly one.
  const res = await client.request({ path: '/', method: 'GET', headers: { host: 'quitter.pools.localhost' } });
  await res.body.dump();
  t.equal(res.headers['x-service-remaining-slots'], '0');
  t.equal(res.headers['x-service-effective-limit'], '1');
  t.same(dp().governor.state(poolId), { ...dp().governor.state(poolId), inFlight: 0, queued: 0 });

  // A client that leaves while queued leaves the queue.
  const holder = client.request({ path: '/delay/500', method: 'GET', headers: { host: 'quitter.pools.localhost' } });
  await until('the holder to take the slot', () => dp().governor.state(poolId).inFlight === 1);
  const ac2 = new AbortController();
  const queued = client.request({ path: '/', method: 'GET', headers: { host: 'quitter.pools.localhost' }, signal: ac2.signal }).catch((e: Error) => e);
  await until('the second request to wait', () => dp().governor.state(poolId).queued === 1);
  ac2.abort();
  await queued;
  await until('the aborted request to leave the queue', () => dp().governor.state(poolId).queued === 0);
  await (await holder).body.dump();
  await until('the holder to release the slot', () => dp().governor.state(poolId).inFlight === 0);
});

t.test(`${CHURN_TOTAL.toLocaleString('en-US')} requests with random client aborts, upstream resets and timeouts leave zero slots and zero waiters`, async (t) => {
  // The request timeout is far above a short request's time on a loaded machine (at load average 32 one of 300 ms
  // was reached by 1,796 of 2,000, so neither resets nor answers happened), and the slow answers are far above it.
  const poolId = await createPool('churn', 50, { requestTimeoutMs: 1000, queueTimeoutMs: 2000, queueLength: 400 });
  const client = new Pool(proxyUrl(), { connections: 200 });
  t.teardown(() => client.close());
  const TOTAL = CHURN_TOTAL;
  const started = performance.now();
  const tally = await churn({ clients: [client], host: 'churn.pools.localhost', total: TOTAL, workers: 200, seed: 42, slowMs: 2000 });
  const secs = (performance.now() - started) / 1000;
  t.comment(`${TOTAL} requests in ${secs.toFixed(1)} s (${Math.round(TOTAL / secs)}/s): ${JSON.stringify(Object.fromEntries(tally))}`);
  // The point is the slot accounting below; this shows the churn did real work of every kind, and that each answer
  // is one the mix asks for. How many are served is the machine's speed against the 300 ms request timeout (the
  // short requests reach it too on a loaded machine: 925 of 2,500 at load average 20, under a quarter in a run at
  // 15-19), so it is no bound: every answer that is not a 200 must be a reset's 502, a timeout's 504 or an abort.
  t.ok((tally.get('200') ?? 0) > 0 && (tally.get('502') ?? 0) > 0 && (tally.get('504') ?? 0) > 0 && (tally.get('aborted') ?? 0) > 0, 'served, resets, timeouts and aborts all happened');
  t.same([...tally.keys()].filter((k) => !['200', '502', '504', 'aborted'].includes(k)), [], 'no other answer');
  await until('no request left in the data plane', () => dp().inFlight === 0);
  const s = dp().governor.state(poolId);
  t.equal(s.inFlight, 0, 'zero slots held');
  t.equal(s.queued, 0, 'zero waiters');
});
