import t from 'tap';
import { startTestApi } from './helpers/service.js';

t.test('GET /api/v1/me returns the token\'s user, team and abilities, unwrapped', async (t) => {
  const svc = await startTestApi();
  t.teardown(() => svc.close());
  const boot = await svc.bootstrap({ team: 'Acme Corp', email: 'owner@acme.test' });
  const res = await svc.api('GET', '/api/v1/me', { token: boot.token });
  t.equal(res.status, 200);
  t.same(res.body.user, { id: boot.user.id, name: 'owner', email: 'owner@acme.test' });
  t.same(res.body.team, { id: boot.team.id, name: 'Acme Corp', slug: 'acme-corp' });
  t.same(res.body.abilities, ['budgets:read', 'keys:write', 'metrics:read', 'pools:read', 'pools:write']);
  t.notOk('data' in res.body, 'identity response is not wrapped in data');
});

t.test('a missing, malformed, unknown or revoked token is 401 with an Error body', async (t) => {
  const svc = await startTestApi();
  t.teardown(() => svc.close());
  const boot = await svc.bootstrap();
  for (const headers of [{}, { authorization: 'Bearer' }, { authorization: 'Basic abc' }, { authorization: 'Bearer pgt_nope' }]) {
    const res = await svc.api('GET', '/api/v1/me', { headers });
    t.equal(res.status, 401, JSON.stringify(headers));
    t.same(res.body, { message: 'missing or invalid API token' });
  }
  const made = await svc.admin(['token', 'create', '--team', boot.team.slug, '--user', String(boot.user.id), '--lifetime', '1mo']);
  t.equal((await svc.api('GET', '/api/v1/me', { token: made.token })).status, 200);
  await svc.admin(['token', 'revoke', '--team', boot.team.slug, '--id', String(made.id)]);
  t.equal((await svc.api('GET', '/api/v1/me', { token: made.token })).status, 401);
});
