// Bytes the proxy's isolate allocates per proxied request (issue 29: allocation drives the scavenges, and with them
// CPU and the tail): poolgate and the Node floor (bench/lib/node-floor.mjs) in front of the same https origin, each
// warmed up, then --rounds windows of --requests requests at full speed (autocannon -a), each window measured by
// bench/lib/alloc-probe.mjs inside the proxy. Median of the windows. Not timed, so the machine's load does not matter;
// the proxy's background work in a window (a few seconds) is included and is small beside the requests'.
// Usage: node bench/alloc.mjs [--requests=10000 --warmup=3000 --rounds=3 --connections=16 --before=<built checkout>]
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import autocannon from 'autocannon';
import { startTlsOrigin, startPoolgateTarget, probe } from './lib/proxy-targets.mjs';
import { startChild } from './lib/child.mjs';
import { root } from './lib/poolgate.mjs';

const arg = (name, def) => process.argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? def;
const REQUESTS = Number(arg('requests', 10000));
const WARMUP = Number(arg('warmup', 3000));
const ROUNDS = Number(arg('rounds', 3));
const CONNECTIONS = Number(arg('connections', 16));
const BEFORE = arg('before', null);
const TARGETS = arg('targets', BEFORE ? 'poolgate_before,poolgate,node_floor' : 'poolgate,node_floor').split(',');
const log = (m) => process.stderr.write(`[alloc] ${m}\n`);
const median = (xs) => [...xs].sort((a, b) => a - b)[(xs.length - 1) >> 1];

async function send(url, headers, n) {
  const r = await autocannon({ url, connections: CONNECTIONS, amount: n, timeout: 60, headers });
  const ok = Number(r.statusCodeStats?.['200']?.count ?? 0);
  if (ok !== n || r.errors > 0) throw new Error(`${url}: ${ok}/${n} answered 200, ${r.errors} errors`);
}

async function window(target, out) {
  process.kill(target.pid, 'SIGUSR2');
  await new Promise((r) => setTimeout(r, 50));
  await send(target.url, target.headers, REQUESTS);
  process.kill(target.pid, 'SIGUSR2');
  for (let i = 0; ; i++) {
    await new Promise((r) => setTimeout(r, 100));
    try {
      const m = JSON.parse(readFileSync(out, 'utf8'));
      rmSync(out);
      return m;
    } catch (err) {
      if (i > 100) throw err;
    }
  }
}

const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-alloc-'));
const stops = [];
const rows = [];
try {
  const { origin, certFile, originUrl } = await startTlsOrigin(dir, '127.0.0.1');
  stops.push(() => origin.stop());
  const nodeArgs = ['--import', join(root, 'bench/lib/alloc-probe.mjs')];
  for (const key of TARGETS) {
    const out = join(dir, `${key}.json`);
    const env = { ALLOC_OUT: out };
    const target =
      key === 'node_floor'
        ? await startChild(join(root, 'bench/lib/node-floor.mjs'), [originUrl, certFile], { nodeArgs, env }).then((f) => ({ ...f, url: `http://127.0.0.1:${f.port}/`, headers: {} }))
        : await startPoolgateTarget(originUrl, certFile, dir, { maxConcurrent: 1000, nodeArgs, env, bin: key === 'poolgate_before' ? join(BEFORE, 'bin', 'poolgate.js') : undefined });
    stops.push(() => target.stop());
    await probe({ name: key, url: target.url, headers: target.headers });
    await send(target.url, target.headers, WARMUP);
    const perRequest = [];
    const scavenges = [];
    for (let i = 0; i < ROUNDS; i++) {
      const m = await window(target, out);
      perRequest.push(m.allocated / REQUESTS);
      scavenges.push(((m.counts.Scavenge ?? 0) * 1000) / REQUESTS);
      log(`${key} window ${i + 1}: ${Math.round(m.allocated / REQUESTS)} bytes a request, collections ${JSON.stringify(m.counts)}, pauses ${m.pauseMs.toFixed(1)} ms`);
    }
    rows.push({ target: key, bytes_per_request: Math.round(median(perRequest)), windows: perRequest.map(Math.round), scavenges_per_1000: median(scavenges) });
    await target.stop();
    stops.pop();
  }
} finally {
  for (const s of stops.reverse()) await s().catch(() => {});
  rmSync(dir, { recursive: true, force: true });
}
const pg = rows.find((r) => r.target === 'poolgate');
const floor = rows.find((r) => r.target === 'node_floor');
console.log(JSON.stringify({ date: new Date().toISOString(), node: process.version, requests: REQUESTS, rounds: ROUNDS, rows, poolgate_over_node_floor: pg && floor ? +(pg.bytes_per_request / floor.bytes_per_request).toFixed(2) : null }));
