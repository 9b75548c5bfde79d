// The dashboard's side of the Control API (issue 17): the session cookie as an alternative to the bearer
// token (HttpOnly, SameSite=Strict, CSRF on changes, sign-out, one-time sign-in links), the key list that
// never shows a key, the live numbers, Re-enable and delivery history, the intake form's read, and the
// dashboard's pages with their security headers.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { request } from 'undici';
import { startTestService } from './helpers/service.js';
import { sha256Hex } from '../src/security/tokens.js';

const svc = await startTestService();
t.teardown(() => svc.close());
const sql = svc.service.sql;
const boot = await svc.bootstrap();

async function signIn(body: unknown): Promise<{ status: number; cookie: string | null; setCookie: string; body: any }> {
  const res = await svc.api('POST', '/api/v1/session', { body });
  const setCookie = String(res.headers['set-cookie'] ?? '');
  const m = /^poolgate_session=([^;]*)/.exec(setCookie);
  return { status: res.status, cookie: m ? `poolgate_session=${m[1]}` : null, setCookie, body: res.body };
}

const withCookie = (cookie: string, csrf?: string): Record<string, string> => (csrf ? { cookie, 'x-csrf-token': csrf } : { cookie });

t.test('an API token becomes an HttpOnly SameSite=Strict session cookie; the store keeps only its hash', async (t) => {
  const s = await signIn({ token: boot.token });
  t.equal(s.status, 201);
  t.ok(s.cookie, 'a session cookie is set');
  t.match(s.setCookie, /; Path=\//);
  t.match(s.setCookie, /; HttpOnly/);
  t.match(s.setCookie, /; SameSite=Strict/);
  t.notMatch(s.setCookie, /Secure/, 'not Secure on plain http');
  t.notMatch(s.setCookie, new RegExp(boot.token), 'the cookie is not the API token');
  t.match(s.body, { csrf_token: /^[0-9a-f]{64}$/, user_id: boot.user.id, team_id: boot.team.id });
  const secret = s.cookie!.split('=')[1]!;
  const { rows } = await sql.query<Record<string, unknown>>('SELECT * FROM dashboard_sessions WHERE session_hash = $1', [sha256Hex(secret)]);
  t.equal(rows.length, 1);
  t.notOk(Object.values(rows[0]!).some((v) => typeof v === 'string' && v.includes(secret)), 'the secret itself is stored nowhere');

  const pools = await svc.api('GET', '/api/v1/pools', { headers: withCookie(s.cookie!) });
  t.equal(pools.status, 200, 'reads work with the cookie alone');
  const me = await svc.api('GET', '/api/v1/session', { headers: withCookie(s.cookie!) });
  t.equal(me.body.csrf_token, s.body.csrf_token, 'the page can ask for its CSRF token again');
});

t.test('a bad token opens no session', async (t) => {
  const s = await signIn({ token: 'pgt_' + 'x'.repeat(40) });
  t.equal(s.status, 401);
  t.equal(s.cookie, null);
});

t.test('changes with the session cookie need its CSRF token; without it nothing is written', async (t) => {
  const s = await signIn({ token: boot.token });
  const before = (await sql.query<{ n: number }>('SELECT count(*)::int AS n FROM pools')).rows[0]!.n;
  const body = { origin: `https://csrf-${randomBytes(3).toString('hex')}.example.com` };
  const none = await svc.api('POST', '/api/v1/pools', { headers: withCookie(s.cookie!), body });
  t.equal(none.status, 403);
  t.match(none.body.message, /X-CSRF-Token/);
  const wrong = await svc.api('POST', '/api/v1/pools', { headers: withCookie(s.cookie!, 'f'.repeat(64)), body });
  t.equal(wrong.status, 403);
  const other = await signIn({ token: boot.token });
  const crossed = await svc.api('POST', '/api/v1/pools', { headers: withCookie(s.cookie!, other.body.csrf_token), body });
  t.equal(crossed.status, 403, 'another session\'s CSRF token does not fit');
  t.equal((await sql.query<{ n: number }>('SELECT count(*)::int AS n FROM pools')).rows[0]!.n, before, 'nothing was created');
  const ok = await svc.api('POST', '/api/v1/pools', { headers: withCookie(s.cookie!, s.body.csrf_token), body });
  t.equal(ok.status, 201);
});

t.test('bearer auth is unchanged: a bad Authorization header is 401 even beside a live session cookie', async (t) => {
  const s = await signIn({ token: boot.token });
  const res = await svc.api('GET', '/api/v1/pools', { token: 'pgt_' + 'y'.repeat(40), headers: withCookie(s.cookie!) });
  t.equal(res.status, 401);
  const bearer = await svc.api('POST', '/api/v1/pools', { token: boot.token, body: { origin: `https://b-${randomBytes(3).toString('hex')}.example.com` } });
  t.equal(bearer.status, 201, 'a bearer call needs no CSRF header');
  const junk = await svc.api('GET', '/api/v1/pools', { headers: { cookie: 'poolgate_session=pgs_' + 'z'.repeat(40) } });
  t.equal(junk.status, 401, 'an unknown session is 401');
});

t.test('sign-out ends the session on the server; revoking its token ends it too', async (t) => {
  const s = await signIn({ token: boot.token });
  const noCsrf = await svc.api('DELETE', '/api/v1/session', { headers: withCookie(s.cookie!) });
  t.equal(noCsrf.status, 403, 'sign-out is a change: it needs the CSRF token');
  const out = await svc.api('DELETE', '/api/v1/session', { headers: withCookie(s.cookie!, s.body.csrf_token) });
  t.equal(out.status, 204);
  t.match(String(out.headers['set-cookie']), /poolgate_session=; .*Max-Age=0/);
  t.equal((await svc.api('GET', '/api/v1/pools', { headers: withCookie(s.cookie!) })).status, 401, 'the old cookie no longer works');

  const tok = await svc.admin(['token', 'create', '--team', boot.team.slug, '--user', String(boot.user.id), '--name', 'short']);
  const s2 = await signIn({ token: tok.token });
  t.equal((await svc.api('GET', '/api/v1/pools', { headers: withCookie(s2.cookie!) })).status, 200);
  await svc.admin(['token', 'revoke', '--team', boot.team.slug, '--id', String(tok.id)]);
  t.equal((await svc.api('GET', '/api/v1/pools', { headers: withCookie(s2.cookie!) })).status, 401, 'a revoked token\'s session is over');
});

t.test('a sign-in link is single use, short-lived and stored hashed; the secret rides in the URL fragment', async (t) => {
  const email = `member-${randomBytes(3).toString('hex')}@example.test`;
  await svc.admin(['user', 'add', '--team', boot.team.slug, '--email', email, '--role', 'member']);
  const out = await svc.admin(['login-link', '--team', boot.team.slug, '--email', email]);
  t.match(out.url, /^http:\/\/127\.0\.0\.1:\d+\/dashboard\/login#pgl_[A-Za-z0-9]{40}$/);
  const ttl = Date.parse(out.expires_at) - Date.now();
  t.ok(ttl > 14 * 60_000 && ttl <= 15 * 60_000, 'valid for 15 minutes');
  const link = out.url.split('#')[1];
  const { rows } = await sql.query<{ link_hash: string }>('SELECT link_hash FROM dashboard_login_links WHERE link_hash = $1', [sha256Hex(link)]);
  t.equal(rows.length, 1, 'stored as its hash');

  const s = await signIn({ login_link: link });
  t.equal(s.status, 201);
  t.same(s.body.abilities, ['budgets:read', 'metrics:read', 'pools:read'], 'a member signs in read-only');
  const again = await signIn({ login_link: link });
  t.equal(again.status, 410, 'a used link is dead');
  t.equal(again.cookie, null);
  const create = await svc.api('POST', '/api/v1/pools', { headers: withCookie(s.cookie!, s.body.csrf_token), body: { origin: 'https://member.example.com' } });
  t.equal(create.status, 403, 'a member cannot create pools');

  const late = await svc.admin(['login-link', '--team', boot.team.slug, '--email', email]);
  const lateLink = late.url.split('#')[1];
  await sql.query("UPDATE dashboard_login_links SET expires_at = now() - interval '1 second' WHERE link_hash = $1", [sha256Hex(lateLink)]);
  t.equal((await signIn({ login_link: lateLink })).status, 410, 'an expired link is dead');
  t.equal((await signIn({ login_link: 'pgl_' + 'q'.repeat(40) })).status, 401);
});

t.test('GET /api/v1/pools/{pool}/keys lists keys, never the plaintext', async (t) => {
  const pool = (await svc.api('POST', '/api/v1/pools', { token: boot.token, body: { origin: `https://k-${randomBytes(3).toString('hex')}.example.com` } })).body.data;
  const a = (await svc.api('POST', `/api/v1/pools/${pool.subdomain}/keys`, { token: boot.token, body: { label: 'first' } })).body.data;
  const b = (await svc.api('POST', `/api/v1/pools/${pool.subdomain}/keys`, { token: boot.token, body: { label: 'second', access: 'read' } })).body.data;
  await svc.api('DELETE', `/api/v1/pools/${pool.subdomain}/keys/${a.id}`, { token: boot.token });
  const res = await svc.api('GET', `/api/v1/pools/${pool.subdomain}/keys`, { token: boot.token });
  t.equal(res.status, 200);
  t.same(res.body.data.map((k: any) => [k.id, k.label, k.access, k.last_four, k.revoked_at !== null]), [
    [b.id, 'second', 'read', b.key.slice(-4), false],
    [a.id, 'first', 'write', a.key.slice(-4), true],
  ]);
  const text = JSON.stringify(res.body);
  t.notOk(text.includes(a.key) || text.includes(b.key) || '"key"' in res.body.data[0], 'no plaintext key');
  t.equal((await svc.api('GET', '/api/v1/pools/no-such-pool/keys', { token: boot.token })).status, 404);
  const narrow = await svc.admin(['token', 'create', '--team', boot.team.slug, '--user', String(boot.user.id), '--abilities', 'metrics:read']);
  t.equal((await svc.api('GET', `/api/v1/pools/${pool.subdomain}/keys`, { token: narrow.token })).status, 403, 'needs pools:read');
});

t.test('live numbers and per-minute rollups are read through the API', async (t) => {
  const pool = (await svc.api('POST', '/api/v1/pools', { token: boot.token, body: { origin: `https://l-${randomBytes(3).toString('hex')}.example.com` } })).body.data;
  const live = await svc.api('GET', '/api/v1/metrics/live', { token: boot.token });
  t.equal(live.status, 200);
  t.match(live.body.data.find((p: any) => p.pool_id === pool.id), {
    subdomain: pool.subdomain, reporting: true, in_flight: 0, queued: 0, max_concurrent: pool.max_concurrent,
    last_minute: { admitted: 0, status_429: 0, status_504: 0, status_5xx: 0 },
  });
  await sql.query(`INSERT INTO pool_metrics_minute (pool_id, minute, requests, admitted, queued, rejected) VALUES ($1, date_trunc('minute', now()) - interval '5 minutes', 10, 8, 3, 2)`, [pool.id]);
  const minutes = await svc.api('GET', `/api/v1/pools/${pool.subdomain}/metrics/minutes?window=1h`, { token: boot.token });
  t.equal(minutes.status, 200);
  t.match(minutes.body.data, [{ requests: 10, admitted: 8, queued: 3, rejected: 2, upstream_errors: 0 }]);
  t.match(minutes.body.data[0], { queue_wait_p50_ms: null, queue_wait_p95_ms: null, upstream_p50_ms: null, upstream_p95_ms: null, effective_limit: null },
    'a minute without latency observations has no percentiles (not zeros)');
  t.equal((await svc.api('GET', `/api/v1/pools/${pool.subdomain}/metrics/minutes?window=7d`, { token: boot.token })).status, 422);
});

t.test('Re-enable and the delivery history of a destination', async (t) => {
  const created = await svc.api('POST', '/api/v1/webhooks', { token: boot.token, body: { name: 'hist', url: 'https://hooks.example.com/in' } });
  t.equal(created.status, 201);
  const id = created.body.data.id;
  await sql.query('UPDATE webhook_endpoints SET disabled = true, consecutive_failures = 8 WHERE id = $1', [id]);
  await sql.query(
    `INSERT INTO webhook_delivery_attempts (webhook_endpoint_id, job_id, result, http_status, error, attempt, latency_ms)
     VALUES ($1, 'job_a', 'failure', 500, 'HTTP 500', 1, 12), ($1, 'job_b', 'success', 200, NULL, 1, 9)`,
    [id],
  );
  const failures = await svc.api('GET', `/api/v1/webhooks/${id}/deliveries?result=failure`, { token: boot.token });
  t.match(failures.body.data, [{ job_id: 'job_a', result: 'failure', http_status: 500 }]);
  t.equal(failures.body.data.length, 1);
  t.equal((await svc.api('GET', `/api/v1/webhooks/${id}/deliveries`, { token: boot.token })).body.data.length, 2);
  const on = await svc.api('POST', `/api/v1/webhooks/${id}/enable`, { token: boot.token });
  t.equal(on.status, 200);
  t.equal(on.body.data.disabled, false);
  const { rows } = await sql.query<{ consecutive_failures: number }>('SELECT consecutive_failures FROM webhook_endpoints WHERE id = $1', [id]);
  t.equal(rows[0]!.consecutive_failures, 0, 'the failure streak starts over');
  t.equal((await svc.api('POST', '/api/v1/webhooks/999999/enable', { token: boot.token })).status, 404);
});

t.test('the intake link answers JSON to clients and the HTML form to browsers; reading does not spend it', async (t) => {
  const pool = (await svc.api('POST', '/api/v1/pools', { token: boot.token, body: { origin: `https://i-${randomBytes(3).toString('hex')}.example.com` } })).body.data;
  const h = (await svc.api('POST', `/api/v1/pools/${pool.subdomain}/auth-handoff`, { token: boot.token, body: { auth_method: 'api_key' } })).body;
  const path = new URL(h.intake_url).pathname;
  const info = await svc.api('GET', path);
  t.equal(info.status, 200);
  t.match(info.body, { pool: { subdomain: pool.subdomain }, auth_method: 'api_key', required_fields: ['api_key'], optional_fields: ['header_name'] });
  const html = await request(h.intake_url, { headers: { accept: 'text/html,application/xhtml+xml,*/*;q=0.8' } });
  t.equal(html.statusCode, 200);
  t.match(String(html.headers['content-type']), /text\/html/);
  t.match(String(html.headers['content-security-policy']), /frame-ancestors 'none'/);
  t.match(await html.body.text(), /intake\.js/);
  t.equal((await svc.api('POST', path, { body: { api_key: 'k1' } })).status, 200);
  t.equal((await svc.api('GET', path)).status, 410, 'once used, the link is dead');
});

t.test('dashboard pages: one shell, strict CSP without inline script, never framed', async (t) => {
  for (const p of ['/dashboard', '/dashboard/pools/x', '/dashboard/login']) {
    const res = await request(`${svc.controlUrl}${p}`);
    t.equal(res.statusCode, 200, p);
    const csp = String(res.headers['content-security-policy']);
    t.match(csp, /script-src 'self'(;|$)/);
    t.notMatch(csp, /unsafe-inline|unsafe-eval/);
    t.match(csp, /frame-ancestors 'none'/);
    t.equal(res.headers['x-frame-options'], 'DENY');
    t.equal(res.headers['referrer-policy'], 'no-referrer');
    const body = await res.body.text();
    t.notMatch(body, /<script(?![^>]*\bsrc=)/, 'no inline script');
  }
  const missing = await request(`${svc.controlUrl}/dashboard/assets/../../package.json`);
  t.not(missing.statusCode, 200);
  await missing.body.dump();
});

t.test('the OpenAPI document lists the new endpoints and the session cookie scheme', async (t) => {
  const doc = (await (await request(`${svc.controlUrl}/api/v1/openapi.json`)).body.json()) as any;
  for (const p of ['/api/v1/session', '/api/v1/pools/{pool}/keys', '/api/v1/metrics/live', '/api/v1/pools/{pool}/metrics/minutes', '/api/v1/webhooks/{webhookEndpoint}/enable', '/api/v1/webhooks/{webhookEndpoint}/deliveries', '/api/v1/intake/{token}']) {
    t.ok(doc.paths[p], p);
  }
  t.ok(doc.paths['/api/v1/pools/{pool}/keys'].get);
  const minute = doc.components.schemas.MinuteRollup;
  for (const f of ['queue_wait_p50_ms', 'queue_wait_p95_ms', 'upstream_p50_ms', 'upstream_p95_ms', 'effective_limit', 'upstream_errors']) t.ok(minute.properties[f], `MinuteRollup.${f} documented`);
  t.same(doc.components.securitySchemes.session, { type: 'apiKey', in: 'cookie', name: 'poolgate_session' });
  t.notOk(Object.keys(doc.paths).some((p) => p.startsWith('/dashboard')), 'pages are not API operations');
});
