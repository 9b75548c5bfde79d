// Issue 26 item 5: the dashboard's rough edges. One range said the same way in the API, the CLI and beside the field;
// webhooks created in the UI (secret shown once); a long delivery history in pages; the "Since" input and the
// destinations fieldset styled like the other controls; the sign-in hint never breaks inside `--email`.
import t from 'tap';
import { runAdmin } from '../src/admin/commands.js';
import { startTestService } from './helpers/service.js';
import { startOrigin } from './helpers/origin.js';
import { startReceiver } from './helpers/receiver.js';
import { ensureDashboardBuilt, launchBrowser, needChromium } from './helpers/browser.js';

t.setTimeout(240_000);

const origin = await startOrigin();
t.teardown(() => origin.close());
const receiver = await startReceiver();
t.teardown(() => receiver.close());
const svc = await startTestService({ overrides: { originCaFile: origin.caFile, webhookCaFile: receiver.caFile } });
t.teardown(() => svc.close());
const boot = await svc.bootstrap({ plan: 'team' });
const token = boot.token;
const sub = (await svc.api('POST', '/api/v1/pools', { token, body: { origin: origin.url, name: 'Billing API' } })).body.data.subdomain as string;

t.test('an out-of-range max_concurrent is told the same range by the API and the CLI', async (t) => {
  for (const value of [0, 100_001]) {
    const res = await svc.api('PATCH', `/api/v1/pools/${sub}/settings`, { token, body: { max_concurrent: value } });
    t.equal(res.status, 422);
    t.equal(res.body.message, 'body.max_concurrent must be an integer from 1 to 100000', `API, ${value}`);
  }
  const nested = await svc.api('PATCH', `/api/v1/pools/${sub}/settings`, { token, body: { settings: { adaptiveMin: 0 } } });
  t.equal(nested.body.message, 'body.settings.adaptiveMin must be an integer from 1 to 100000', 'a nested setting says its range too');
  const deps = { config: svc.config, sql: svc.service.sql, box: svc.service.box, now: () => new Date() };
  for (const value of ['0', '100001']) {
    const cli = await runAdmin(['pool', 'set', sub, '--team', boot.team.slug, '--max-concurrent', value], deps);
    t.equal(cli.code, 2);
    t.match(cli.stderr, /^--max-concurrent must be an integer from 1 to 100000\n/, `CLI, ${value}`);
  }
  const cliSetting = await runAdmin(['pool', 'set', sub, '--team', boot.team.slug, '--adaptive-min', '0'], deps);
  t.match(cliSetting.stderr, /^--adaptive-min must be an integer from 1 to 100000\n/);
});

t.test('in the browser', async (t) => {
  const skip = needChromium();
  if (skip) return t.skip(skip);
  await ensureDashboardBuilt();
  const browser = await launchBrowser({ viewport: { width: 390, height: 800 } });
  t.teardown(() => browser.close());
  const page = browser.page;
  const dash = `${svc.controlUrl}/dashboard`;

  await page.goto(dash);
  const parts = page.locator('code.command .nowrap');
  t.equal(await parts.count(), 3);
  const lines = await parts.evaluateAll((els) => els.map((e) => ({ text: e.textContent, rects: e.getClientRects().length })));
  t.same(lines.map((l) => l.rects), [1, 1, 1], `on a phone, the hint breaks between options, never inside one: ${JSON.stringify(lines)}`);
  t.equal(lines[2]!.text, '--email EMAIL');

  await page.setViewportSize({ width: 1280, height: 860 });
  await page.getByLabel('API token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Pools', level: 1 }).waitFor();

  // A destination created in the UI.
  await page.goto(`${dash}/webhooks`);
  await page.getByRole('heading', { name: 'New destination' }).waitFor();
  const fieldset = page.locator('#webhook-create fieldset');
  t.equal(await fieldset.evaluate((e) => getComputedStyle(e).borderTopLeftRadius), '8px', 'the pools fieldset is styled');
  await page.getByLabel('Name').fill('Receiver');
  await page.getByLabel('URL').fill(receiver.url);
  await page.getByLabel('Billing API').check();
  await page.getByRole('button', { name: 'Create destination' }).click();
  const secret = page.locator('#webhook-created .secret');
  await secret.waitFor();
  const listed = await svc.api('GET', '/api/v1/webhooks', { token });
  const hook = listed.body.data[0];
  t.match(hook, { name: 'Receiver', url: receiver.url });
  t.equal(hook.pool_ids.length, 1, 'attached to the pool ticked');
  const shown = await secret.inputValue();
  t.match(shown, /^\S{20,}$/, 'the signing secret is shown once');
  t.notOk(JSON.stringify(listed.body).includes(shown), 'and is not in the list afterwards');
  await page.locator('#webhooks-table tbody tr[data-webhook]').first().waitFor();
  t.equal(await page.locator('#webhooks-table tbody tr[data-webhook]').count(), 1, 'and the destination is listed');

  // 100 deliveries: a page of 20, then the next.
  await svc.service.sql.query(
    `INSERT INTO webhook_delivery_attempts (webhook_endpoint_id, job_id, pool_id, attempted_at, result, http_status, attempt, latency_ms)
     SELECT $1, 'job_' || g, NULL, now() - g * interval '1 second', 'success', 200, 1, 12 FROM generate_series(1, 100) g`,
    [hook.id],
  );
  await page.goto(`${dash}/webhooks/${hook.id}`);
  const pager = page.locator('#deliveries-pager [data-field="page"]');
  await pager.waitFor();
  t.equal(await pager.textContent(), '1–20 of 100');
  t.equal(await page.locator('#deliveries-table tbody tr').count(), 20);
  t.equal(await page.locator('#deliveries-table tbody tr').first().getAttribute('data-job'), 'job_1', 'newest first');
  await page.getByRole('button', { name: 'Older' }).click();
  t.equal(await pager.textContent(), '21–40 of 100');
  t.equal(await page.locator('#deliveries-table tbody tr').first().getAttribute('data-job'), 'job_21');
  const height = await page.evaluate(() => document.documentElement.scrollHeight);
  t.ok(height < 2200, `the page stays short (${height} px; 4,566 px with every row)`);
  const since = page.getByLabel('Since');
  t.same(await since.evaluate((e) => [getComputedStyle(e).borderTopWidth, getComputedStyle(e).paddingLeft]), ['1px', '10px'], 'the Since input is styled like the others');
});
