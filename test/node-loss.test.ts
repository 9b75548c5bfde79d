// Issue 27 item 4: a data plane node lost. Three `dataplane` processes behind a real HAProxy (Debian's, run
// from examples/haproxy.cfg with its ports and check interval rewritten), health-checked on /readyz; one is
// SIGKILLed under paced traffic. The balancer marks it down within its checks (fall × inter), the dead node's
// slots come back within one lease term (governorLeaseTermMs), and the origin never sees more than
// max_concurrent.
import t from 'tap';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { fromRoot } from '../src/config/paths.js';
import { needServer } from './helpers/servers.js';
import { startTestService } from './helpers/service.js';
import { freePort, startRedisServer } from './helpers/redis-server.js';
import { countingOrigin, dataplaneNodeEnv, pacedLoad, startNode, stopNode, when, type Node } from './helpers/failover-load.js';
import { soak } from './helpers/soak.js';

const haproxy = spawnSync('haproxy', ['-v']).status === 0;
const skip = (await needServer('postgres')) || (await needServer('redis')) || (haproxy ? false : 'no haproxy on this machine (apt-get install haproxy)');

const TERM_MS = 3000;
const MAX = 6;
const INTER_MS = 200;
const FALL = 2;
const RUN = soak({ preMs: 5000, postMs: 10_000, paceMs: 30 }, { preMs: 1000, postMs: 1500, paceMs: 60 });

/** examples/haproxy.cfg with this test's ports, a stats socket and a faster check interval. */
function haproxyConfig(port: number, nodes: Node[], socket: string): string {
  const example = readFileSync(fromRoot('examples', 'haproxy.cfg'), 'utf8');
  const servers = nodes.map((n, i) => `  server dataplane-${i + 1} 127.0.0.1:${n.proxy} port ${n.metrics}`).join('\n');
  const cfg = example
    .replace(/^global\n/m, `global\n  stats socket ${socket} level admin\n`)
    .replace(/^  bind :\d+$/m, `  bind 127.0.0.1:${port}`)
    .replace(/ inter 1s fall 3 /, ` inter ${INTER_MS}ms fall ${FALL} `)
    .replace(/ port 9465$/m, '')
    .replace(/(?:^  server .*\n?)+/m, `${servers}\n`);
  if (!cfg.includes(`inter ${INTER_MS}ms`) || !cfg.includes(`bind 127.0.0.1:${port}`)) throw new Error('examples/haproxy.cfg changed shape');
  return cfg;
}

/** The status column of `show stat` for one server ("UP", "DOWN", "UP 1/2", …). */
async function serverStatus(socket: string, name: string): Promise<string> {
  const out = await new Promise<string>((resolve, reject) => {
    let data = '';
    const c = createConnection(socket, () => c.end('show stat\n'));
    c.on('data', (d) => (data += d));
    c.on('end', () => resolve(data));
    c.on('error', reject);
  });
  const lines = out.split('\n');
  const cols = lines[0]!.replace(/^# /, '').split(',');
  const row = lines.find((l) => l.startsWith(`dataplane,${name},`));
  return row ? row.split(',')[cols.indexOf('status')]! : '';
}

t.test('a data plane node SIGKILLed behind HAProxy', { skip }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-haproxy-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const origin = await countingOrigin();
  t.teardown(() => origin.close());
  const redisPort = await freePort();
  const redisProc = await startRedisServer(redisPort);
  t.teardown(() => {
    redisProc.kill('SIGKILL');
  });
  const control = await startTestService({ engine: 'postgres', roles: ['control'] });
  t.teardown(() => control.close());
  const teamId = (await control.bootstrap()).team.id;
  const { rows } = await control.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, 'lost', 'lost', 'http', $2, $3, $4, false, $5::jsonb) RETURNING id`,
    [teamId, origin.url, new URL(origin.url).host, MAX, JSON.stringify({ queueTimeoutMs: 10_000, queueLength: 500, adaptive: false })],
  );
  const poolId = rows[0]!.id;
  await control.service.sql.notify(CHANGE_CHANNEL, `pool:${poolId}`);

  const env = dataplaneNodeEnv(control, origin.caFile, { REDIS_URL: `redis://127.0.0.1:${redisPort}`, POOLGATE_GOVERNOR_LEASE_TERM_MS: String(TERM_MS) });
  const nodes: Node[] = await Promise.all([0, 1, 2].map(() => startNode(env)));
  t.teardown(() => Promise.all(nodes.map(stopNode)));

  const port = await freePort();
  const socket = join(dir, 'haproxy.sock');
  writeFileSync(join(dir, 'haproxy.cfg'), haproxyConfig(port, nodes, socket));
  const hap = spawn('haproxy', ['-f', join(dir, 'haproxy.cfg'), '-db'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let hapErr = '';
  hap.stderr.on('data', (d) => (hapErr = (hapErr + d).slice(-4000)));
  t.teardown(() => {
    hap.kill('SIGKILL');
  });
  const allUp = await when(async () => (await Promise.all([1, 2, 3].map((i) => serverStatus(socket, `dataplane-${i}`)))).every((s) => s === 'UP'), 20_000);
  if (!allUp) throw new Error(`HAProxy does not see the three nodes ready: ${hapErr}`);

  const redis = new Redis({ port: redisPort });
  t.teardown(() => redis.disconnect());
  const slotsKey = `poolgate:{p:${poolId}}:${poolId}:slots`;
  origin.takePeak('lost');
  const t0 = performance.now();
  const load = pacedLoad(`http://127.0.0.1:${port}`, 'lost', { paceMs: RUN.paceMs, holdMs: 300, t0 });
  await new Promise((r) => setTimeout(r, RUN.preMs));

  // The leases in Redis at the kill, with their deadlines: the dead node's are never refreshed again.
  const killed = nodes[0]!;
  const before = await redis.zrange(slotsKey, 0, -1, 'WITHSCORES');
  const killAt = performance.now() - t0;
  killed.child.kill('SIGKILL');
  const atKill = new Map<string, string>();
  for (let i = 0; i < before.length; i += 2) atKill.set(before[i]!, before[i + 1]!);

  const down = await when(async () => (await serverStatus(socket, 'dataplane-1')).startsWith('DOWN'), 10_000);
  const downS = down === null ? NaN : (down - t0 - killAt) / 1000;
  // Slots back: no lease of the kill's snapshot is still there with its deadline of then (the live nodes
  // refresh theirs every third of a term, or release them).
  const back = await when(async () => {
    const now = await redis.zrange(slotsKey, 0, -1, 'WITHSCORES');
    for (let i = 0; i < now.length; i += 2) if (atKill.get(now[i]!) === now[i + 1]) return false;
    return true;
  }, TERM_MS * 3);
  const backS = back === null ? NaN : (back - t0 - killAt) / 1000;
  await new Promise((r) => setTimeout(r, RUN.postMs));
  await load.stop();
  const peak = origin.takePeak('lost');

  const after = down === null ? [] : load.samples.filter((s) => s.start > down - t0);
  const failed = load.samples.filter((s) => s.status !== 200);
  const failedBy: Record<string, number> = {};
  for (const s of failed) failedBy[`${s.status} ${s.error ?? ''}`.trim()] = (failedBy[`${s.status} ${s.error ?? ''}`.trim()] ?? 0) + 1;
  const deadLeases = [...atKill.keys()].length;
  t.comment(JSON.stringify({ requests: load.samples.length, failed: failed.length, failedBy, leasesAtKill: deadLeases, balancerDownS: downS, slotsBackS: backS, peak, max: MAX }));

  t.ok(downS <= ((FALL + 1) * INTER_MS) / 1000 + 2, `HAProxy took the dead node out ${downS.toFixed(2)} s after the kill (checks every ${INTER_MS} ms, fall ${FALL})`);
  t.ok(backS <= TERM_MS / 1000 + 1, `the dead node's slots came back ${backS.toFixed(2)} s after the kill (lease term ${TERM_MS / 1000} s)`);
  t.ok(peak <= MAX, `the origin never saw more than max_concurrent ${MAX} (peak ${peak})`);
  t.ok(after.length > 0 && after.every((s) => s.status === 200), `every request sent after the balancer took the node out was served (${after.length})`);
  // What a SIGKILL costs: the requests in flight on that node, all begun before the balancer took it out.
  // HAProxy answers them 502, or cuts the client's connection where the dead node had begun its answer; it
  // does not send them again (they may have reached the origin).
  const cut = (s: { status: number; error: string | null }) => s.status === 0 && /other side closed|socket|ECONNRESET/i.test(s.error ?? '');
  t.ok(
    failed.every((s) => (s.status === 502 || s.status === 503 || cut(s)) && (down === null || s.start <= down - t0)),
    `the only failures are the dead node's requests in flight (${JSON.stringify(failedBy)})`,
  );
});
