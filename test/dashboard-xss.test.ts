// Hostile text on every dashboard page (issue 17): `<script>`, `"><img src=x onerror=…>` and `javascript:`
// strings in every text an attacker can reach (pool, key, budget, team, user, credential and webhook
// names, webhook URLs and descriptions, delivery errors, the intake's pool name), rendered on every page,
// with nothing executed: no dialog, no console error (a CSP refusal would be one), no request for the
// injected image, no injected element, and the marker the payloads would set stays unset.
import t from 'tap';
import type * as Tap from 'tap';
import { randomBytes } from 'node:crypto';
import { startTestService } from './helpers/service.js';
import { ensureDashboardBuilt, launchBrowser, needChromium } from './helpers/browser.js';

t.setTimeout(300_000);
const skip = needChromium();
if (skip) {
  t.plan(0, skip);
  process.exit(0);
}
await ensureDashboardBuilt();

const SCRIPT = '<script>window.__xss=1</script>';
const IMG = '"><img src=x onerror="window.__xss=2">';
const JS_URL = 'javascript:window.__xss=3';
const HOSTILE = `${IMG}${SCRIPT} ${JS_URL}`;
const tag = () => randomBytes(2).toString('hex');

/** Setup checks: thrown, so a broken setup fails the file instead of asserting outside a test. */
function must(ok: boolean, what: string): void {
  if (!ok) throw new Error(`setup failed: ${what}`);
}

const svc = await startTestService();
t.teardown(() => svc.close());
const boot = await svc.bootstrap({ plan: 'team', team: `${SCRIPT}${tag()}` });
const sql = svc.service.sql;
// The owner's display name is shown in the header on every page.
await sql.query('UPDATE users SET name = $2 WHERE id = $1', [boot.user.id, `${IMG} ${JS_URL}`]);

const created = await svc.api('POST', '/api/v1/pools', { token: boot.token, body: { origin: 'https://xss.example.com', name: HOSTILE } });
must(created.status === 201, 'a hostile pool name is stored as text');
const pool = created.body.data;
await sql.query('UPDATE pools SET description = $2 WHERE id = $1', [pool.id, HOSTILE]);
const key = await svc.api('POST', `/api/v1/pools/${pool.subdomain}/keys`, { token: boot.token, body: { label: IMG.slice(0, 60) } });
must(key.status === 201, 'hostile key label');
await svc.api('POST', `/api/v1/pools/${pool.subdomain}/keys`, { token: boot.token, body: { label: JS_URL } });
const budget = await svc.admin(['budget', 'create', '--team', boot.team.slug, '--name', HOSTILE, '--origin-max', '20']);
await svc.admin(['budget', 'attach', '--team', boot.team.slug, '--budget', String(budget.id ?? budget.budget?.id), '--pool', pool.subdomain, '--reserved', '2']);
const hook = await svc.api('POST', '/api/v1/webhooks', {
  token: boot.token,
  body: { name: `${IMG}${tag()}`, description: HOSTILE, url: `https://hooks.example.com/in?x="><img src=x onerror=alert(4)>&j=javascript:alert(5)`, pool_ids: [pool.id] },
});
must(hook.status === 201, JSON.stringify(hook.body));
const hookId = hook.body.data.id;
await sql.query('UPDATE webhook_endpoints SET disabled = true WHERE id = $1', [hookId]);
await sql.query(
  `INSERT INTO webhook_delivery_attempts (webhook_endpoint_id, job_id, pool_id, result, http_status, error, attempt, latency_ms)
   VALUES ($1, $2, $3, 'failure', 500, $4, 1, 5)`,
  [hookId, `job_${IMG}`, pool.id, `origin answered: ${HOSTILE}`],
);
const handoff = await svc.api('POST', `/api/v1/pools/${pool.subdomain}/auth-handoff`, { token: boot.token, body: { auth_method: 'api_key', credential_name: HOSTILE.slice(0, 60) } });
must(handoff.status === 200, JSON.stringify(handoff.body));

const browser = await launchBrowser();
t.teardown(() => browser.close());
const page = browser.page;
const problems: string[] = [];
const controlOrigin = new URL(svc.controlUrl).origin;
const watch = (p: typeof page) => {
  p.on('dialog', (d) => {
    problems.push(`dialog: ${d.message()}`);
    void d.dismiss();
  });
  p.on('pageerror', (e) => problems.push(`page error: ${e}`));
  p.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) problems.push(`console: ${m.text()}`);
  });
  p.on('request', (r) => {
    const u = new URL(r.url());
    if (u.origin !== controlOrigin || !/^\/(dashboard(\/|$)|api\/v1\/)/.test(u.pathname) || /\/x$/.test(u.pathname)) problems.push(`request: ${r.url()}`);
  });
};
watch(page);

async function checkPage(t: Tap.Test, p: typeof page, what: string, mustShow: string): Promise<void> {
  await p.getByText(mustShow, { exact: false }).first().waitFor({ timeout: 10_000 });
  const found = await p.evaluate(() => ({
    marker: (window as unknown as { __xss?: number }).__xss ?? null,
    images: document.querySelectorAll('img').length,
    scripts: [...document.scripts].map((s) => s.src),
    jsLinks: [...document.querySelectorAll('a')].filter((a) => /^\s*javascript:/i.test(a.getAttribute('href') ?? '')).length,
    handlers: [...document.querySelectorAll('*')].filter((e) => [...e.attributes].some((a) => a.name.startsWith('on'))).length,
  }));
  t.equal(found.marker, null, `${what}: no payload ran`);
  t.equal(found.images, 0, `${what}: no injected image`);
  t.same(found.scripts.map((s) => new URL(s).pathname), [/intake/.test(p.url()) ? '/dashboard/assets/intake.js' : '/dashboard/assets/app.js'], `${what}: only poolgate's own script`);
  t.equal(found.jsLinks, 0, `${what}: no javascript: link`);
  t.equal(found.handlers, 0, `${what}: no inline event handler attribute`);
}

t.test('every page renders the hostile text as text and runs none of it', async (t) => {
  await page.goto(`${svc.controlUrl}/dashboard`);
  await page.getByLabel('API token').fill(boot.token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Pools', level: 1 }).waitFor();
  await checkPage(t, page, 'Pools', SCRIPT);
  t.ok(await page.locator('header').getByText(IMG).isVisible(), 'the user name is shown as text');

  await page.goto(`${svc.controlUrl}/dashboard/pools/${pool.subdomain}`);
  await page.locator('#keys-table').getByText(JS_URL).waitFor();
  await checkPage(t, page, 'Pool', HOSTILE);
  t.ok(await page.getByRole('heading', { level: 1, name: HOSTILE }).isVisible(), 'the pool name is the heading, verbatim');

  await page.goto(`${svc.controlUrl}/dashboard/budgets`);
  await checkPage(t, page, 'Budgets', `${IMG}${SCRIPT}`);

  await page.goto(`${svc.controlUrl}/dashboard/webhooks`);
  await checkPage(t, page, 'Webhooks', 'hooks.example.com');

  await page.goto(`${svc.controlUrl}/dashboard/webhooks/${hookId}`);
  await page.locator('#deliveries-table').getByText('origin answered').waitFor();
  await checkPage(t, page, 'Webhook details', 'origin answered');

  // A forged path with markup in it: the not-found text stays text.
  await page.goto(`${svc.controlUrl}/dashboard/pools/${encodeURIComponent(IMG)}`);
  await checkPage(t, page, 'Unknown pool', 'not found');

  const intake = await browser.context.newPage();
  watch(intake);
  await intake.goto(handoff.body.intake_url);
  await intake.getByRole('heading', { name: 'Enter a credential' }).waitFor();
  await checkPage(t, intake, 'Intake', HOSTILE);
  await intake.close();

  t.same(problems, [], 'no dialog, script error, CSP refusal or stray request on any page');
});
