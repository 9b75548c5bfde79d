// The dashboard end to end in a real browser (issue 17): sign in with a pasted API token; create a pool;
// mint a key (plaintext shown once); change max_concurrent and see x-service-effective-limit follow on
// the proxy; watch in-flight rise under load; re-enable a deactivated destination and see deliveries
// resume, replay one and recover one; the Pool page's charts and its destinations form; fill the intake
// form and see has_credential become true; a used intake link is dead; sign out.
import t from 'tap';
import { request } from 'undici';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { startTestService } from './helpers/service.js';
import { startOrigin } from './helpers/origin.js';
import { startReceiver } from './helpers/receiver.js';
import { ensureDashboardBuilt, launchBrowser, needChromium } from './helpers/browser.js';

// A real browser on a loaded machine: more than the default per-file limit (about 30 s on a quiet one).
t.setTimeout(300_000);
const skip = needChromium();
if (skip) {
  t.plan(0, skip);
  process.exit(0);
}
await ensureDashboardBuilt();

const origin = await startOrigin();
t.teardown(() => origin.close());
const receiver = await startReceiver();
t.teardown(() => receiver.close());
const svc = await startTestService({ overrides: { originCaFile: origin.caFile, webhookCaFile: receiver.caFile, webhookRetryBaseMs: 50, webhookRetryCapMs: 200 } });
t.teardown(() => svc.close());
const boot = await svc.bootstrap({ plan: 'team' });
const browser = await launchBrowser();
t.teardown(() => browser.close());
const page = browser.page;
const pageErrors: string[] = [];
page.on('pageerror', (e) => pageErrors.push(String(e)));
// API answers like 401 before sign-in or 422 on a bad field are logged by the browser as failed loads: not script errors.
const scriptError = (text: string) => !text.startsWith('Failed to load resource');
page.on('console', (m) => {
  if (m.type() === 'error' && scriptError(m.text())) pageErrors.push(m.text());
});
const dash = `${svc.controlUrl}/dashboard`;

const proxy = (host: string, path: string, key?: string, extra: Record<string, string> = {}) =>
  request(`${svc.proxyUrl}${path}`, { headers: { host, ...(key ? { 'x-service-key': key } : {}), ...extra } });
const ASYNC = { 'x-service-async': 'true' };

t.test('sign in with a pasted token: a session cookie, nothing of the token in the page or storage', async (t) => {
  await page.goto(dash);
  await page.getByLabel('API token').fill(boot.token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Pools', level: 1 }).waitFor();
  t.match(page.url(), /\/dashboard\/pools$/);
  const cookies = await browser.context.cookies();
  const session = cookies.find((c) => c.name === 'poolgate_session');
  t.ok(session, 'session cookie set');
  t.equal(session!.httpOnly, true);
  t.equal(session!.sameSite, 'Strict');
  t.notOk(cookies.some((c) => c.value.includes(boot.token)));
  const visible = await page.evaluate(() => [document.cookie, JSON.stringify(localStorage), JSON.stringify(sessionStorage), document.documentElement.outerHTML, location.href].join('\n'));
  t.notOk(visible.includes(boot.token), 'the token is in no URL, storage, script-readable cookie or the page');
  t.notOk(visible.includes(session!.value), 'the session secret is not readable by the page');
});

let pool: { subdomain: string; host: string; id: number };
let key = '';

t.test('create a pool from the Pools page', async (t) => {
  await page.getByLabel('Origin URL').fill(origin.url);
  await page.getByLabel('Name (optional)').fill('Billing API');
  await page.getByRole('button', { name: 'Create pool' }).click();
  await page.getByRole('heading', { name: 'Billing API', level: 1 }).waitFor();
  const sub = decodeURIComponent(page.url().split('/pools/')[1]!);
  const res = await svc.api('GET', `/api/v1/pools/${sub}`, { token: boot.token });
  t.equal(res.status, 200);
  t.equal(res.body.data.name, 'Billing API');
  pool = { subdomain: sub, host: `${sub}.${svc.config.poolDomain}`, id: res.body.data.id };
});

t.test('mint a key: the plaintext is shown once with a copy button, then never again', async (t) => {
  await page.locator('#mint-form').getByLabel('Label').fill('ci runner');
  await page.locator('#mint-form').getByRole('button', { name: 'Mint key' }).click();
  const secret = page.getByRole('region', { name: 'New pool key' });
  await secret.waitFor();
  key = await secret.locator('input').inputValue();
  t.match(key, /^pgk_[A-Za-z0-9]{40}$/);
  t.ok(await secret.getByRole('button', { name: 'Copy' }).isVisible(), 'a copy button');
  await page.locator('#keys-table').getByText('ci runner').waitFor();
  const ok = await proxy(pool.host, '/hello', key);
  t.equal(ok.statusCode, 200, 'the minted key admits traffic');
  await ok.body.dump();
  await page.reload();
  await page.locator('#keys-table').getByText('ci runner').waitFor();
  t.notOk((await page.content()).includes(key), 'after a reload the key is gone from the page');
  t.ok(await page.locator('#keys-table').getByText(`…${key.slice(-4)}`).isVisible(), 'only its last four remain');
});

t.test('settings: the API\'s validation error beside the field; max_concurrent reaches the proxy', async (t) => {
  const before = await proxy(pool.host, '/hello', key);
  await before.body.dump();
  const initial = Number(before.headers['x-service-effective-limit']);
  t.ok(initial > 3, `initial effective limit ${initial}`);
  const max = page.locator('#settings-form').getByLabel('Max concurrent');
  await max.fill('0');
  await page.getByRole('button', { name: 'Save settings' }).click();
  const err = page.locator(`#${await max.getAttribute('id')}-err`);
  await err.filter({ hasText: /max_concurrent/ }).waitFor();
  t.equal(await max.getAttribute('aria-invalid'), 'true', 'the field is marked invalid');
  t.match(await err.textContent(), /^max_concurrent must be an integer from 1 to 100000$/, 'the whole range, as the CLI says it (issue 26 item 5)');
  await max.fill('3');
  await page.getByRole('button', { name: 'Save settings' }).click();
  await page.locator('#settings-form').getByText('Saved').waitFor();
  let limit = '';
  for (let i = 0; i < 50 && limit !== '3'; i++) {
    const res = await proxy(pool.host, '/hello', key);
    await res.body.dump();
    limit = String(res.headers['x-service-effective-limit']);
    if (limit !== '3') await new Promise((r) => setTimeout(r, 100));
  }
  t.equal(limit, '3', 'x-service-effective-limit follows the new max_concurrent');
});

t.test('the Pools page shows in-flight rising under load, refreshed within 2 s', async (t) => {
  await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Pools' }).click();
  const row = page.locator(`tr[data-pool="${pool.subdomain}"]`);
  await row.waitFor();
  t.equal(await row.locator('[data-field="max_concurrent"]').textContent(), '3');
  const load = Array.from({ length: 5 }, () => proxy(pool.host, '/delay/2500', key).then((r) => r.body.dump()));
  const started = Date.now();
  await page.waitForFunction((sub) => {
    const cell = document.querySelector(`tr[data-pool="${sub}"] [data-field="in_flight"]`);
    return cell !== null && /^3\b/.test(cell.textContent ?? '');
  }, pool.subdomain, { timeout: 3000 });
  t.ok(Date.now() - started < 3000, `in-flight reached 3 on the page after ${Date.now() - started} ms`);
  await page.waitForFunction((sub) => {
    const cell = document.querySelector(`tr[data-pool="${sub}"] [data-field="queued"]`);
    return cell !== null && cell.textContent === '2';
  }, pool.subdomain, { timeout: 3000 });
  t.pass('the two requests above the limit show as queued');
  await Promise.all(load);
  await page.waitForFunction((sub) => document.querySelector(`tr[data-pool="${sub}"] [data-field="in_flight"]`)?.textContent?.startsWith('0'), pool.subdomain, { timeout: 4000 });
  t.pass('in-flight falls back to 0');
});

t.test('the Pool page charts the minutes: requests by outcome, queue wait and upstream p50/p95, effective limit', async (t) => {
  // The load above queued two requests ~2.5 s behind three that spent ~2.5 s upstream.
  await svc.service.rollups!.flush();
  await page.goto(`${dash}/pools/${pool.subdomain}`);
  const summary = page.getByText(/^Last hour: \d+ requests/);
  await summary.waitFor();
  const text = (await summary.textContent()) ?? '';
  t.match(text, /queue wait p95 \d+(\.\d+)? ms/, `queue wait p95 shown: ${text}`);
  const up = /upstream p95 (\d+(?:\.\d+)?) ms/.exec(text);
  t.ok(up && Number(up[1]) >= 2000, 'the 2.5 s answers show in the upstream p95');
  t.equal(await page.locator('#chart canvas').count(), 3, 'three charts drawn');
  for (const name of ['Requests per minute', 'Queue wait and upstream latency', 'Effective limit (lowest in the minute)']) {
    t.ok(await page.getByRole('img', { name }).isVisible(), name);
  }
});

t.test('re-enable a deactivated destination: the pool goes async again and deliveries resume', async (t) => {
  const hook = await svc.api('POST', '/api/v1/webhooks', { token: boot.token, body: { name: 'billing events', url: `${receiver.url}/hook`, pool_ids: [pool.id] } });
  t.equal(hook.status, 201);
  const id = hook.body.data.id;
  // Deactivated as the deliverer leaves it after 8 failures in a row; the pool is reloaded by the data plane.
  await svc.service.sql.query('UPDATE webhook_endpoints SET disabled = true, consecutive_failures = 8 WHERE id = $1', [id]);
  await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${pool.id}`);
  let sync = 0;
  for (let i = 0; i < 50 && sync !== 200; i++) {
    const r = await proxy(pool.host, '/hello', key, ASYNC);
    await r.body.dump();
    sync = r.statusCode;
    if (sync !== 200) await new Promise((r) => setTimeout(r, 100));
  }
  t.equal(sync, 200, 'with its only destination deactivated, the pool serves synchronously');

  await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Webhooks' }).click();
  await page.getByRole('link', { name: 'billing events' }).click();
  await page.getByText('Deactivated').first().waitFor();
  await page.getByRole('button', { name: 'Re-enable' }).click();
  await page.getByText('Re-enabled: deliveries resume.').waitFor();
  t.ok(await page.locator('[data-state="active"]').isVisible(), 'shown active');

  let status = 0;
  for (let i = 0; i < 50 && status !== 202; i++) {
    const r = await proxy(pool.host, '/hello', key, ASYNC);
    await r.body.dump();
    status = r.statusCode;
    if (status !== 202) await new Promise((r) => setTimeout(r, 100));
  }
  t.equal(status, 202, 'the pool runs requests as async jobs again');
  const got = await receiver.waitFor('/hook', 1, 15_000);
  t.equal(got.length, 1, 'a delivery reached the destination');
  await page.reload();
  await page.locator('#deliveries-table tr[data-result="success"]').first().waitFor({ timeout: 10_000 });
  await page.getByLabel('Show').selectOption('failure');
  await page.locator('#deliveries-table').getByText('No deliveries.').waitFor();
  t.pass('delivery history shows the success and filters by result');

  // Replay that delivery: it reaches the destination again.
  await page.getByLabel('Show').selectOption('');
  const jobRow = page.locator('#deliveries-table tr[data-result="success"]').first();
  await jobRow.waitFor();
  const job = await jobRow.getAttribute('data-job');
  await jobRow.getByRole('button', { name: `Replay the delivery of job ${job}` }).click();
  await page.getByText(`Replay of job ${job} queued`).waitFor();
  const again = await receiver.waitFor('/hook', 2, 15_000);
  t.equal(again.length, 2, 'the replayed delivery arrived again');

  // Recover since an hour ago sends again what was given up: that delivery, marked failed as the deliverer
  // leaves it after its last retry.
  await svc.service.sql.query(`UPDATE webhook_deliveries SET status = 'failed', finished_at = now() WHERE webhook_endpoint_id = $1`, [id]);
  const since = await page.evaluate(() => {
    const d = new Date(Date.now() - 3_600_000);
    d.setMinutes(d.getMinutes() - d.getTimezoneOffset());
    return d.toISOString().slice(0, 16);
  });
  await page.getByLabel('Since').fill(since);
  await page.getByRole('button', { name: 'Recover' }).click();
  const recovered = page.getByText(/^\d+ failed deliver(y|ies) queued again\.$/);
  await recovered.waitFor();
  t.equal(await recovered.textContent(), '1 failed delivery queued again.');
  t.ok((await receiver.waitFor('/hook', 3, 15_000)).length >= 3, 'the recovered delivery arrived');

  // Detach the destination from the pool on the Pool page's form (PUT /api/v1/pools/{pool}/webhooks).
  await page.goto(`${dash}/pools/${pool.subdomain}`);
  const box = page.locator('#destinations-form').getByLabel('billing events');
  t.ok(await box.isChecked(), 'the attached destination is checked');
  await box.uncheck();
  await page.getByRole('button', { name: 'Save destinations' }).click();
  await page.locator('#destinations-form').getByText('Saved').waitFor();
  const after = await svc.api('GET', '/api/v1/webhooks', { token: boot.token });
  t.same(after.body.data.find((w: any) => w.id === id).pool_ids, [], 'the pool is detached through the API');
});

t.test('the intake form: fill it once, has_credential becomes true, the link is then dead', async (t) => {
  const h = await svc.api('POST', `/api/v1/pools/${pool.subdomain}/auth-handoff`, { token: boot.token, body: { auth_method: 'bearer_static' } });
  t.equal(h.status, 200);
  t.equal(h.body.dashboard_url, `${dash}/pools/${pool.subdomain}`);
  const intake = await browser.context.newPage();
  intake.on('pageerror', (e) => pageErrors.push(String(e)));
  intake.on('console', (m) => {
    if (m.type() === 'error' && scriptError(m.text())) pageErrors.push(m.text());
  });
  await intake.goto(h.body.intake_url);
  await intake.getByRole('heading', { name: 'Enter a credential' }).waitFor({ timeout: 5000 }).catch(async (e) => {
    t.fail(`intake page: ${pageErrors.join(' | ')} ${await intake.content()}`);
    throw e;
  });
  await intake.getByLabel('Bearer token').fill('origin-secret-token');
  await intake.getByRole('button', { name: 'Save credential' }).click();
  await intake.locator('#intake-done').waitFor();
  const after = await svc.api('GET', `/api/v1/pools/${pool.subdomain}`, { token: boot.token });
  t.equal(after.body.data.has_credential, true);
  await intake.goto(h.body.intake_url);
  await intake.locator('#intake-dead').waitFor();
  t.match(await intake.locator('#intake-dead').textContent(), /already used/);
  await intake.close();
  const r = await proxy(pool.host, '/hello', key);
  const echo = (await r.body.json()) as { headers: Record<string, string> };
  t.equal(echo.headers.authorization, 'Bearer origin-secret-token', 'the origin receives the credential entered in the form');
});

t.test('sign out ends the session', async (t) => {
  const before = (await browser.context.cookies()).find((c) => c.name === 'poolgate_session')!;
  await page.goto(`${dash}/pools`);
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByLabel('API token').waitFor();
  const res = await svc.api('GET', '/api/v1/pools', { headers: { cookie: `poolgate_session=${before.value}` } });
  t.equal(res.status, 401, 'the old session cookie no longer works');
  t.same(pageErrors, [], 'no script errors on any page');
});
