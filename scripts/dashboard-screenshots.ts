// Screenshots of each dashboard page for docs/screenshots (README): a service with realistic pools,
// traffic, a budget, webhook deliveries and an intake link, photographed in Debian's chromium.
//   npx tsx scripts/dashboard-screenshots.ts
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { request } from 'undici';
import { startTestService } from '../test/helpers/service.js';
import { startOrigin } from '../test/helpers/origin.js';
import { startReceiver } from '../test/helpers/receiver.js';
import { ensureDashboardBuilt, launchBrowser } from '../test/helpers/browser.js';
import { bucketOf, LATENCY_BUCKETS } from '../src/domain/latency-buckets.js';

const out = new URL('../docs/screenshots/', import.meta.url).pathname;
mkdirSync(out, { recursive: true });
await ensureDashboardBuilt();
const origin = await startOrigin();
// One origin per pool: a pool is reused for the same origin.
const origins = [origin, await startOrigin(), await startOrigin()];
const caFile = `${tmpdir()}/poolgate-shots-ca-${process.pid}.pem`;
writeFileSync(caFile, origins.map((o) => readFileSync(o.caFile, 'utf8')).join('\n'));
const receiver = await startReceiver();
receiver.queue('/events', { status: 500 }, { status: 500 });
const svc = await startTestService({ overrides: { logLevel: 'silent', originCaFile: caFile, webhookCaFile: receiver.caFile, webhookRetryBaseMs: 200, webhookRetryCapMs: 400 } });
const boot = await svc.bootstrap({ plan: 'team', team: 'Acme Payments', email: 'dana@acme.example' });
await svc.service.sql.query("UPDATE users SET name = 'Dana Reyes' WHERE id = $1", [boot.user.id]);
const api = async (method: 'GET' | 'POST' | 'PATCH' | 'PUT', path: string, body?: unknown) => (await svc.api(method, path, { token: boot.token, body })).body;

const pools = [];
for (const [i, [name, max]] of ([['Billing API', 8], ['Search', 20], ['Geocoder', 4]] as const).entries()) {
  const p = (await api('POST', '/api/v1/pools', { origin: origins[i]!.url, name })).data;
  if (p.name !== name) throw new Error(`pool ${name} reused ${p.name}`);
  await api('PATCH', `/api/v1/pools/${p.subdomain}/settings`, { max_concurrent: max });
  pools.push(p);
}
// One origin fronts all three here, so give each its own origin path by name only (reuse is per origin URL).
const db = (await api('POST', '/api/v1/pools/database', { db_host: 'db.acme.example', db_name: 'ledger', name: 'Ledger DB' })).data;
const keys = [];
for (const p of pools) keys.push((await api('POST', `/api/v1/pools/${p.subdomain}/keys`, { label: 'production worker' })).data.key);
await api('POST', `/api/v1/pools/${pools[0].subdomain}/keys`, { label: 'staging', access: 'read', expires_preset: '7d' });
const rk = (await api('POST', `/api/v1/pools/${pools[0].subdomain}/keys`, { label: 'old laptop' })).data;
await svc.api('DELETE', `/api/v1/pools/${pools[0].subdomain}/keys/${rk.id}`, { token: boot.token });
const budget = await svc.admin(['budget', 'create', '--team', boot.team.slug, '--name', 'Maps vendor', '--origin-max', '24']);
const budgetId = budget.id ?? budget.budget?.id;
await svc.admin(['budget', 'attach', '--team', boot.team.slug, '--budget', String(budgetId), '--pool', pools[1].subdomain, '--reserved', '12']);
await svc.admin(['budget', 'attach', '--team', boot.team.slug, '--budget', String(budgetId), '--pool', pools[2].subdomain, '--reserved', '4']);

// An hour of history in the rollups, so the charts have a shape.
const now = Date.now();
/** n values around `ms` (a rough log-normal), counted into the rollups' fixed latency buckets. */
const spread = (n: number, ms: number): number[] => {
  const h = new Array<number>(LATENCY_BUCKETS).fill(0);
  for (let i = 0; i < n; i++) h[bucketOf(ms * Math.exp((Math.random() - 0.5) * 1.6))]!++;
  return h;
};
for (let m = 60; m >= 1; m--) {
  const wave = Math.round(300 + 200 * Math.sin(m / 7) + Math.random() * 60);
  const rejected = m % 13 === 0 ? 25 : Math.round(Math.random() * 3);
  const admitted = wave - rejected;
  await svc.service.sql.query(
    `INSERT INTO pool_metrics_minute (pool_id, minute, requests, admitted, queued, rejected, upstream_errors, queue_wait_hist, upstream_hist, effective_limit_min)
     VALUES ($1, date_trunc('minute', $2::timestamptz), $3, $4, $5, $6, $7, $8::int8[], $9::int8[], $10)`,
    [pools[0].id, new Date(now - m * 60_000), wave, admitted, Math.round(wave * 0.15), rejected, m % 17 === 0 ? 4 : 0,
      spread(admitted, wave > 400 ? 40 : 5), spread(admitted, wave > 400 ? 180 : 90), wave > 450 ? 6 : 8],
  );
}

const hook = (await api('POST', '/api/v1/webhooks', { name: 'Billing events', description: 'Job results for the billing service', url: `${receiver.url}/events`, pool_ids: [pools[0].id] })).data;
await api('POST', '/api/v1/webhooks', { name: 'Audit log', url: 'https://audit.acme.example/hooks/poolgate', pool_ids: [] });
for (let i = 0; i < 3; i++) {
  const r = await request(`${svc.proxyUrl}/v1/invoices`, { method: 'POST', headers: { host: `${pools[0].subdomain}.${svc.config.poolDomain}`, 'x-service-key': keys[0], 'x-service-async': 'true' } });
  await r.body.dump();
}
await receiver.waitFor('/events', 5, 20_000).catch(() => {});
await svc.service.sql.query('UPDATE webhook_endpoints SET disabled = true, consecutive_failures = 8 WHERE id = $1', [hook.id]);
const handoff = await api('POST', `/api/v1/pools/${pools[2].subdomain}/auth-handoff`, { auth_method: 'api_key' });

// Live load: a steady stream of slow requests on two pools while the pages are photographed.
let running = true;
const hammer = async (i: number, ms: number) => {
  while (running) {
    const r = await request(`${svc.proxyUrl}/delay/${ms}`, { headers: { host: `${pools[i].subdomain}.${svc.config.poolDomain}`, 'x-service-key': keys[i] } }).catch(() => null);
    await r?.body.dump();
  }
};
const load = [...Array.from({ length: 11 }, () => hammer(0, 900)), ...Array.from({ length: 9 }, () => hammer(1, 400)), ...Array.from({ length: 6 }, () => hammer(2, 1500))];

const browser = await launchBrowser({ viewport: { width: 1280, height: 800 } });
const page = browser.page;
const shot = async (name: string) => {
  await new Promise((r) => setTimeout(r, 600));
  await page.screenshot({ path: `${out}${name}.png`, fullPage: false });
  console.log(`${name}.png`);
};
await page.goto(`${svc.controlUrl}/dashboard`);
await page.getByLabel('API token').waitFor();
await shot('sign-in');
await page.getByLabel('API token').fill(boot.token);
await page.getByRole('button', { name: 'Sign in' }).click();
await page.getByRole('heading', { name: 'Pools', level: 1 }).waitFor();
await new Promise((r) => setTimeout(r, 3000));
await shot('pools');
await page.goto(`${svc.controlUrl}/dashboard/pools/${pools[0].subdomain}`);
await page.locator('#chart canvas').nth(2).waitFor();
await page.locator('#mint-form').getByLabel('Label').fill('billing cron');
await page.locator('#mint-form').getByRole('button', { name: 'Mint key' }).click();
await page.getByRole('region', { name: 'New pool key' }).waitFor();
await page.evaluate(() => window.scrollTo(0, 0));
await new Promise((r) => setTimeout(r, 600));
await page.screenshot({ path: `${out}pool.png`, fullPage: true });
console.log('pool.png');
await page.goto(`${svc.controlUrl}/dashboard/budgets`);
await page.getByRole('heading', { name: 'Maps vendor' }).waitFor();
await new Promise((r) => setTimeout(r, 2500));
await shot('budgets');
await page.goto(`${svc.controlUrl}/dashboard/webhooks`);
await page.locator('#webhooks-table').waitFor();
await shot('webhooks');
await page.goto(`${svc.controlUrl}/dashboard/webhooks/${hook.id}`);
await page.locator('#deliveries-table tbody tr').first().waitFor();
await shot('webhook');
await page.goto(handoff.intake_url);
await page.getByRole('heading', { name: 'Enter a credential' }).waitFor();
await shot('intake');
running = false;
await Promise.all(load);
await browser.close();
await svc.close();
for (const o of origins) await o.close();
await receiver.close();
void db;
