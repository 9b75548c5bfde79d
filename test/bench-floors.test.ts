// The floors the benchmarks measure poolgate against (issue 28 item 5, issue 29) do what they claim: the Node
// floor passes an https origin's answer through (status, content-type, body; a request body on), and the
// deliveries floor POSTs the same envelopes signed as the deliverer signs them — every one verifies with the
// product's verifyDelivery against its destination's secret and reaches its destination's path. The pinning
// plan puts the proxy on its own core (on 2 cores: proxy on one, load generator and origin on the other).
import t from 'tap';
import { execFileSync, fork, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { verifyDelivery } from '../src/webhooks/verify.js';

const kit = (file: string) => import(new URL(`../../bench/lib/${file}`, import.meta.url).href);
const { startChild } = await kit('child.mjs');
const { cpuCount, pinPlan } = await kit('proxy-bench-common.mjs');

const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-floors-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const keyFile = join(dir, 'key.pem');
const certFile = join(dir, 'cert.pem');
execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', keyFile, '-out', certFile,
  '-days', '1', '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost'], { stdio: 'ignore' });
const tls = { key: readFileSync(keyFile), cert: readFileSync(certFile) };

async function listen(server: ReturnType<typeof createServer>): Promise<number> {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return (server.address() as AddressInfo).port;
}

t.test('the Node floor passes the origin answer through, request body included', async (t) => {
  const origin = createServer(tls, (req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (c) => (body += c));
    req.on('end', () => res.writeHead(req.url === '/missing' ? 404 : 200, { 'content-type': 'application/json', 'x-other': 'dropped' }).end(JSON.stringify({ method: req.method, url: req.url, body })));
  });
  const port = await listen(origin);
  t.teardown(() => origin.close());
  const floor = await startChild(new URL('../../bench/lib/node-floor.mjs', import.meta.url).pathname, [`https://127.0.0.1:${port}`, certFile]);
  t.teardown(() => floor.stop());
  const base = `http://127.0.0.1:${floor.port}`;

  const got = await request(`${base}/a?b=1`);
  t.equal(got.statusCode, 200);
  t.equal(got.headers['content-type'], 'application/json');
  t.same(await got.body.json(), { method: 'GET', url: '/a?b=1', body: '' });

  const posted = await request(`${base}/p`, { method: 'POST', body: 'hello floor' });
  t.same(await posted.body.json(), { method: 'POST', url: '/p', body: 'hello floor' });

  const missing = await request(`${base}/missing`);
  t.equal(missing.statusCode, 404, 'the status is the origin’s');
  await missing.body.dump();
});

t.test('the floor with the spec’s duties passes headers both ways, adds the governor’s and logs each request', async (t) => {
  const origin = createServer(tls, (req, res) => {
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json', 'x-other': 'kept', connection: 'keep-alive' }).end(JSON.stringify({ url: req.url, headers: req.headers })));
  });
  const port = await listen(origin);
  t.teardown(() => origin.close());
  const logFile = join(dir, 'duties-access.log');
  const floor = await startChild(new URL('../../bench/lib/node-floor.mjs', import.meta.url).pathname, [`https://127.0.0.1:${port}`, certFile, '--obligations', logFile]);
  const base = `http://127.0.0.1:${floor.port}`;

  for (const path of ['/a?b=1', '/c']) {
    const got = await request(`${base}${path}`, { headers: { 'x-client': 'on', 'x-forwarded-for': '6.6.6.6', te: 'trailers' } });
    t.equal(got.statusCode, 200);
    t.equal(got.headers['x-other'], 'kept', 'the origin’s own headers come back');
    t.ok(got.headers['x-service-remaining-slots'] && got.headers['x-service-effective-limit'] === '10000' && got.headers['x-service-queued-ms'] === '0', 'the governor’s headers are added');
    const seen = (await got.body.json()) as { url: string; headers: Record<string, string> };
    t.equal(seen.url, path);
    t.equal(seen.headers['x-client'], 'on', 'the client’s headers reach the origin');
    t.equal(seen.headers['x-forwarded-for'], '127.0.0.1', 'X-Forwarded-For is what the proxy saw, not what the client claimed');
    t.equal(seen.headers['x-forwarded-host'], `127.0.0.1:${floor.port}`);
    t.equal(seen.headers.host, `127.0.0.1:${port}`);
    t.notOk('te' in seen.headers, 'hop-by-hop headers are dropped');
  }
  await floor.stop();
  const lines = readFileSync(logFile, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  t.same(lines.map((l) => [l.log, l.path, l.status, l.outcome]), [['access', '/a?b=1', 200, 'proxied'], ['access', '/c', 200, 'proxied']], 'one access line per request, written by the time it stops');
});

t.test('the deliveries floor sends every delivery once, signed as the deliverer signs, to its own path', async (t) => {
  const seen: { path: string; ok: boolean; webhookId: string | null; jobId: string }[] = [];
  const secrets = new Map([['/d0', 'whsec_floor_zero'], ['/d1', 'whsec_floor_one']]);
  const receiver = createServer(tls, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const raw = Buffer.concat(chunks);
      const v = verifyDelivery(secrets.get(req.url ?? '') ?? 'none', req.headers, raw);
      const envelope = JSON.parse(raw.toString('utf8'));
      seen.push({ path: req.url ?? '', ok: v.ok, webhookId: v.ok ? v.webhookId : null, jobId: v.ok ? v.jobId : '' });
      if (v.ok && !JSON.stringify(envelope).includes(v.jobId)) seen.at(-1)!.ok = false;
      res.writeHead(200).end('ok');
    });
  });
  const port = await listen(receiver);
  t.teardown(() => receiver.close());
  const child: ChildProcess = fork(new URL('../../bench/lib/webhook-floor.mjs', import.meta.url), [certFile], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  t.teardown(() => child.kill());
  const next = (key: string) =>
    new Promise<any>((resolve, reject) => {
      const on = (m: any) => {
        if (m.error) reject(new Error(m.error));
        else if (key in m) resolve(m[key]);
        else return;
        child.off('message', on);
      };
      child.on('message', on);
    });
  await next('started');
  const destinations = [
    { id: 7, url: `https://127.0.0.1:${port}/d0`, secret: 'whsec_floor_zero' },
    { id: 8, url: `https://127.0.0.1:${port}/d1`, secret: 'whsec_floor_one' },
  ];
  const ready = next('ready');
  child.send({ prepare: { tag: 'floortest', events: 25, destinations, concurrency: 8, perDestination: 4, eventType: 'job.completed', pool: { id: 1, host: 'p.pools.localhost' } } });
  await ready;
  const warm = seen.length;
  t.ok(warm > 0, 'connections are warmed before the clock starts');
  const done = next('done');
  child.send({ go: true });
  const r = await done;
  t.equal(r.deliveries, 50);
  t.equal(r.failed, 0);
  const run = seen.slice(warm);
  t.equal(run.length, 50, 'each (event, destination) pair once');
  t.ok(run.every((d) => d.ok), 'every delivery verifies with its destination’s secret');
  t.ok(run.every((d) => d.jobId.startsWith('floortest_')), 'job ids carry the run’s tag');
  t.same(new Set(run.map((d) => `${d.path}|${d.webhookId}`)), new Set(['/d0|7', '/d1|8']), 'each destination id at its own path');
  t.equal(new Set(run.map((d) => `${d.jobId}|${d.path}`)).size, 50, 'no duplicates');
});

t.test('pinning: the proxy alone on its core(s), the rest elsewhere', async (t) => {
  t.equal(cpuCount('1'), 1);
  t.equal(cpuCount('0-6,8'), 8);
  const saved = { ...process.env };
  t.teardown(() => {
    for (const k of ['BENCH_PIN', 'BENCH_PIN_PROXY', 'BENCH_PIN_LOAD']) {
      if (saved[k] === undefined) delete process.env[k];
      else process.env[k] = saved[k];
    }
  });
  process.env.BENCH_PIN = '0';
  t.equal(pinPlan(), null, 'BENCH_PIN=0 turns pinning off');
  delete process.env.BENCH_PIN;
  process.env.BENCH_PIN_PROXY = '8';
  process.env.BENCH_PIN_LOAD = '0-7';
  t.same(pinPlan(), { proxy: '8', load: '0-7', proxy_cpus: 1 });
});
