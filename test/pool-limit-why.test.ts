// Issue 26 item 4: "why is the effective limit 2 when max is 10?" The adaptive limit's last adjustments and their
// cause (latency gradient, 429, rate headers, probe) are shown by GET /api/v1/pools/{pool}/limit, on the Pool page
// and by `admin pool show`.
import t from 'tap';
import { request } from 'undici';
import { runAdmin } from '../src/admin/commands.js';
import { startTestService } from './helpers/service.js';
import { startOrigin } from './helpers/origin.js';
import { ensureDashboardBuilt, launchBrowser, needChromium } from './helpers/browser.js';

t.setTimeout(240_000);

const origin = await startOrigin();
t.teardown(() => origin.close());
const svc = await startTestService({ overrides: { originCaFile: origin.caFile } });
t.teardown(() => svc.close());
const boot = await svc.bootstrap({ plan: 'team' });
const token = boot.token;
const created = await svc.api('POST', '/api/v1/pools', { token, body: { origin: origin.url } });
const sub = created.body.data.subdomain as string;
const key = (await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token })).body.data.key as string;
await svc.service.dataplane!.snapshots.reload();

t.test('a 429 from the upstream moves the limit: the move and its cause are reported', async (t) => {
  const before = await svc.api('GET', `/api/v1/pools/${sub}/limit`, { token });
  t.equal(before.status, 200);
  t.match(before.body.data, { max_concurrent: 10, adaptive: true, adaptive_min: 1, reporting: true, effective_limit: 10, adjustments: [] }, 'nothing moved yet');

  const res = await request(`${svc.proxyUrl}/status/429`, { headers: { host: `${sub}.${svc.config.poolDomain}`, 'x-service-key': key } });
  await res.body.dump();
  t.equal(res.statusCode, 429);

  const after = await svc.api('GET', `/api/v1/pools/${sub}/limit`, { token });
  t.match(after.body.data, { effective_limit: 9, adjustments: [{ from: 10, to: 9, cause: 'status_429', time: String }] }, 'the backoff, with its cause');
  t.ok(Math.abs(Date.parse(after.body.data.adjustments[0].time) - Date.now()) < 60_000);

  const gov = svc.service.dataplane!.governor;
  const live = { source: { state: (id: number) => gov.state(id), lastMinute: () => ({ admitted: 0, status_429: 0, status_504: 0, status_5xx: 0 }), learned: (id: number) => gov.learned?.(id) ?? null } };
  const deps = { config: svc.config, sql: svc.service.sql, box: svc.service.box, now: () => new Date(), live };
  const shown = await runAdmin(['pool', 'show', sub, '--team', boot.team.slug], deps);
  t.equal(shown.code, 0, shown.stderr);
  t.match(JSON.parse(shown.stdout).limit, { max_concurrent: 10, effective_limit: 9, adjustments: [{ from: 10, to: 9, cause: 'status_429' }] }, 'admin pool show says the same');
  const offline = await runAdmin(['pool', 'show', sub, '--team', boot.team.slug], { ...deps, live: undefined });
  t.match(JSON.parse(offline.stdout).limit, { reporting: false, effective_limit: null }, 'without a running data plane it says it does not know');
});

t.test('the Pool page says why the effective limit is below max concurrent', async (t) => {
  const skip = needChromium();
  if (skip) return t.skip(skip);
  await ensureDashboardBuilt();
  const browser = await launchBrowser();
  t.teardown(() => browser.close());
  const page = browser.page;
  await page.goto(`${svc.controlUrl}/dashboard`);
  await page.getByLabel('API token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Pools', level: 1 }).waitFor();
  await page.goto(`${svc.controlUrl}/dashboard/pools/${sub}`);
  const why = page.locator('[data-field="limit_why"]');
  await why.waitFor();
  t.match(await why.textContent(), /holds it at 9 of 10 \(floor 1\); last move: the upstream answered 429/);
  const row = page.locator('table.adjustments tbody tr');
  t.equal(await row.count(), 1);
  t.match(await row.first().textContent(), /10 → 9.*the upstream answered 429/);
});
