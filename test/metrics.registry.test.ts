// The Prometheus registry and its /metrics endpoint: every poolgate metric once, valid text format,
// gauges read from the governor at scrape time, and (when installed) a clean `promtool check metrics`.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { request } from 'undici';
import { MemoryGovernor } from '../src/governor/memory.js';
import { PoolMetrics, recordAdmission, statusClass } from '../src/metrics/registry.js';
import { startMetricsServer } from '../src/metrics/server.js';
import { pool } from './helpers/governor-suite.js';

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** A strict reader of the Prometheus text exposition format (0.0.4); throws on any malformed line. */
function parseExposition(text: string): { types: Map<string, string>; helps: Map<string, string>; samples: Sample[] } {
  const types = new Map<string, string>();
  const helps = new Map<string, string>();
  const samples: Sample[] = [];
  const NAME = '[a-zA-Z_:][a-zA-Z0-9_:]*';
  const sampleRe = new RegExp(`^(${NAME})(?:\\{(.*)\\})? (\\S+)(?: (-?\\d+))?$`);
  const labelRe = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)/y;
  for (const line of text.split('\n')) {
    if (line === '') continue;
    let m: RegExpMatchArray | null;
    if ((m = line.match(new RegExp(`^# HELP (${NAME}) (.*)$`)))) {
      if (helps.has(m[1]!)) throw new Error(`HELP twice for ${m[1]}`);
      helps.set(m[1]!, m[2]!);
    } else if ((m = line.match(new RegExp(`^# TYPE (${NAME}) (counter|gauge|histogram|summary|untyped)$`)))) {
      if (types.has(m[1]!)) throw new Error(`TYPE twice for ${m[1]}`);
      types.set(m[1]!, m[2]!);
    } else if ((m = line.match(sampleRe))) {
      const labels: Record<string, string> = {};
      const body = m[2] ?? '';
      labelRe.lastIndex = 0;
      while (labelRe.lastIndex < body.length) {
        const l = labelRe.exec(body);
        if (!l) throw new Error(`bad labels: ${line}`);
        labels[l[1]!] = l[2]!;
      }
      // Values are Go floats: NaN and Inf in any case, as Prometheus parses them.
      const raw = m[3]!.toLowerCase();
      const value = raw === 'nan' ? NaN : raw === '+inf' || raw === 'inf' ? Infinity : raw === '-inf' ? -Infinity : Number(raw);
      if (Number.isNaN(value) && raw !== 'nan') throw new Error(`bad value: ${line}`);
      samples.push({ name: m[1]!, labels, value });
    } else throw new Error(`unparseable line: ${line}`);
  }
  return { types, helps, samples };
}

const value = (samples: Sample[], name: string, labels: Record<string, string>): number | undefined =>
  samples.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v) && Object.keys(s.labels).length === Object.keys(labels).length)?.value;

const POOLGATE_METRICS: Record<string, string> = {
  poolgate_pool_requests_total: 'counter',
  poolgate_pool_admitted_total: 'counter',
  poolgate_pool_queued_total: 'counter',
  poolgate_pool_rejected_total: 'counter',
  poolgate_pool_in_flight: 'gauge',
  poolgate_pool_queue_length: 'gauge',
  poolgate_pool_effective_limit: 'gauge',
  poolgate_pool_queue_wait_seconds: 'histogram',
  poolgate_upstream_duration_seconds: 'histogram',
  poolgate_policy_refusals_total: 'counter',
  poolgate_lock_acquires_total: 'counter',
  poolgate_wire_pinned_clients: 'gauge',
  poolgate_wire_pins_total: 'counter',
  poolgate_pools: 'gauge',
};

t.test('the registry exposes every poolgate metric once, with process metrics, in valid text format', async (t) => {
  const metrics = new PoolMetrics();
  const gov = new MemoryGovernor();
  t.teardown(() => gov.close());
  gov.configure([pool(1, { maxConcurrent: 3 }), pool(2, { maxConcurrent: 1 })], []);
  let live = [{ poolId: 1, pool: 'alpha' }, { poolId: 2, pool: 'beta' }];
  metrics.watch({ pools: () => live, state: (id) => gov.state(id) });

  const h = metrics.forPool('alpha');
  t.equal(metrics.forPool('alpha'), h, 'handles are made once and cached');
  const a = gov.acquire({ poolId: 1, waitMs: 0 });
  if (a instanceof Promise || !a.ok) throw new Error('expected a slot');
  recordAdmission(h, a, false);
  h.upstream[statusClass(201)].observe(0.12);
  h.requests.admitted.inc();
  const b = metrics.forPool('beta');
  const held = gov.acquire({ poolId: 2, waitMs: 0 });
  const refused = gov.acquire({ poolId: 2, waitMs: 0 });
  if (refused instanceof Promise) throw new Error('expected a synchronous refusal');
  recordAdmission(b, refused, false);
  b.requests.forbidden.inc();
  b.upstream[statusClass(undefined)].observe(2);

  const text = await metrics.registry.metrics();
  const { types, helps, samples } = parseExposition(text);
  for (const [name, type] of Object.entries(POOLGATE_METRICS)) {
    t.equal(types.get(name), type, `${name} is a ${type}`);
    t.ok(helps.get(name), `${name} has help text`);
  }
  t.same(
    [...types.keys()].filter((n) => n.startsWith('poolgate_')).sort(),
    Object.keys(POOLGATE_METRICS).sort(),
    'no other poolgate metric exists',
  );
  t.ok(types.has('process_cpu_user_seconds_total') && types.has('nodejs_eventloop_lag_seconds'), 'process metrics are collected');

  t.equal(value(samples, 'poolgate_pool_admitted_total', { pool: 'alpha' }), 1);
  t.equal(value(samples, 'poolgate_pool_requests_total', { pool: 'alpha', outcome: 'admitted' }), 1);
  t.equal(value(samples, 'poolgate_pool_queue_wait_seconds_count', { pool: 'alpha' }), 1);
  t.equal(value(samples, 'poolgate_upstream_duration_seconds_count', { pool: 'alpha', status_class: '2xx' }), 1);
  t.equal(value(samples, 'poolgate_upstream_duration_seconds_bucket', { pool: 'alpha', status_class: '2xx', le: '0.25' }), 1);
  t.equal(value(samples, 'poolgate_upstream_duration_seconds_bucket', { pool: 'alpha', status_class: '2xx', le: '0.1' }), 0);
  t.equal(value(samples, 'poolgate_pool_rejected_total', { pool: 'beta', reason: 'no_slot' }), 1);
  t.equal(value(samples, 'poolgate_pool_requests_total', { pool: 'beta', outcome: 'rejected_no_slot' }), 1);
  t.equal(value(samples, 'poolgate_pool_requests_total', { pool: 'beta', outcome: 'forbidden' }), 1);
  t.equal(value(samples, 'poolgate_upstream_duration_seconds_count', { pool: 'beta', status_class: 'error' }), 1);
  // Gauges come from the governor at scrape time.
  t.equal(value(samples, 'poolgate_pool_in_flight', { pool: 'alpha' }), 1);
  t.equal(value(samples, 'poolgate_pool_effective_limit', { pool: 'alpha' }), 3);
  t.equal(value(samples, 'poolgate_pool_in_flight', { pool: 'beta' }), 1);
  t.equal(value(samples, 'poolgate_pool_queue_length', { pool: 'beta' }), 0);
  a.permit.release();
  if (!(held instanceof Promise) && held.ok) held.permit.release();
  const after = parseExposition(await metrics.registry.metrics()).samples;
  t.equal(value(after, 'poolgate_pool_in_flight', { pool: 'alpha' }), 0, 'a scrape reads the state now');

  live = [{ poolId: 1, pool: 'alpha' }];
  metrics.forget('beta');
  const gone = parseExposition(await metrics.registry.metrics()).samples;
  t.notOk(
    gone.some((s) => s.labels.pool === 'beta' && !['poolgate_pool_in_flight', 'poolgate_pool_queue_length', 'poolgate_pool_effective_limit'].includes(s.name)),
    'a forgotten pool has no counter or histogram series left',
  );
  t.not(metrics.forPool('beta'), b, 'a forgotten pool gets fresh handles');
});

t.test('statusClass groups statuses and maps a missing or invalid status to error', async (t) => {
  t.same([100, 204, 301, 429, 503, 599].map(statusClass), ['1xx', '2xx', '3xx', '4xx', '5xx', '5xx']);
  t.same([undefined, 0, 99, 600, Number.NaN].map(statusClass), ['error', 'error', 'error', 'error', 'error']);
});

t.test('the metrics server serves GET /metrics on its own port and 404 elsewhere', async (t) => {
  const metrics = new PoolMetrics();
  metrics.forPool('alpha').requests.admitted.inc();
  const srv = await startMetricsServer('127.0.0.1', 0, metrics.registry);
  t.teardown(() => srv.close());
  t.ok(srv.port > 0, 'returns the bound port');
  const base = `http://127.0.0.1:${srv.port}`;

  const res = await request(`${base}/metrics`);
  t.equal(res.statusCode, 200);
  t.match(String(res.headers['content-type']), /^text\/plain; version=0\.0\.4/);
  const text = await res.body.text();
  const { samples } = parseExposition(text);
  t.equal(value(samples, 'poolgate_pool_requests_total', { pool: 'alpha', outcome: 'admitted' }), 1);

  const q = await request(`${base}/metrics?x=1`);
  t.equal(q.statusCode, 200, 'a query string is ignored');
  await q.body.dump();
  for (const path of ['/', '/metrics/', '/api/v1/pools', '/metricsx']) {
    const r = await request(`${base}${path}`);
    t.equal(r.statusCode, 404, path);
    await r.body.dump();
  }
  const post = await request(`${base}/metrics`, { method: 'POST', body: 'x' });
  t.equal(post.statusCode, 405);
  t.equal(post.headers.allow, 'GET, HEAD');
  await post.body.dump();

  // promtool's linter is the reference for naming and format; it is installed on the dev machines and CI.
  const promtool = spawnSync('promtool', ['--version'], { encoding: 'utf8' });
  if (promtool.error) {
    t.skip('promtool check metrics: promtool is not installed (apt-get install prometheus provides it)');
  } else {
    const check = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
    t.equal(check.status, 0, `promtool check metrics passes: ${check.stdout}${check.stderr}`);
    t.equal(`${check.stdout}${check.stderr}`.trim(), '', 'promtool reports no problems');
  }
});

t.test('issue 20: every live pool has its outcome series at 0 from the first scrape, before its first request', async (t) => {
  const metrics = new PoolMetrics({ defaultMetrics: false });
  const gov = new MemoryGovernor();
  t.teardown(() => gov.close());
  gov.configure([pool(7, { maxConcurrent: 2 })], []);
  metrics.watch({ pools: () => [{ poolId: 7, pool: 'quiet' }], state: (id) => gov.state(id) });
  const first = parseExposition(await metrics.registry.metrics()).samples;
  t.equal(value(first, 'poolgate_pools', {}), 1);
  for (const outcome of ['admitted', 'rejected_queue_full', 'queue_timeout', 'upstream_error', 'unauthorized']) {
    t.equal(value(first, 'poolgate_pool_requests_total', { pool: 'quiet', outcome }), 0, `${outcome} at 0`);
  }
  t.equal(value(first, 'poolgate_pool_rejected_total', { pool: 'quiet', reason: 'queue_full' }), 0);
  t.equal(value(first, 'poolgate_pool_admitted_total', { pool: 'quiet' }), 0);
  t.equal(value(first, 'poolgate_lock_acquires_total', { pool: 'quiet', outcome: 'granted' }), 0);
  // The first burst is then an increase from 0.
  metrics.forPool('quiet').requests.admitted.inc(5);
  const second = parseExposition(await metrics.registry.metrics()).samples;
  t.equal(value(second, 'poolgate_pool_requests_total', { pool: 'quiet', outcome: 'admitted' }), 5);
});
