import t from 'tap';
import { runAdmin } from '../src/admin/commands.js';
import { until } from './helpers/until.js';
import { startTestApi, type TestApi } from './helpers/service.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';

let svc: TestApi;
let owner: Awaited<ReturnType<TestApi['bootstrap']>>;
let other: Awaited<ReturnType<TestApi['bootstrap']>>;

t.before(async () => {
  svc = await startTestApi();
  owner = await svc.bootstrap({ team: 'Budget Team' });
  other = await svc.bootstrap({ team: 'Budget Other' });
});
t.teardown(() => svc?.close());

const run = (argv: string[]) => runAdmin(argv, { config: svc.config, sql: svc.sql, box: svc.box, now: () => new Date() });
async function pool(host: string, token = owner.token) {
  const res = await svc.api('POST', '/api/v1/pools', { token, body: { origin: `https://${host}` } });
  return res.body.data as { id: number; subdomain: string };
}

t.test('budgets created and attached with the admin CLI are read through the Control API', async (t) => {
  const seen: string[] = [];
  const unlisten = await svc.sql.listen(CHANGE_CHANNEL, (p) => seen.push(p));
  t.teardown(unlisten);

  const a = await pool('a.budget.example.com');
  const b = await pool('b.budget.example.com');
  const c = await pool('c.budget.example.com');
  const made = await svc.admin(['budget', 'create', '--team', owner.team.slug, '--name', 'Shared origin', '--origin-max', '20']);
  const id = made.budget.id;
  t.match(made.budget, { name: 'Shared origin', origin_max_concurrent: 20, pool_ids: [], unallocated: 20 });

  t.match(await svc.admin(['budget', 'attach', '--team', owner.team.slug, '--budget', String(id), '--pool', a.subdomain, '--reserved', '5']), { reserved_concurrent: 5, unallocated: 15 });
  await svc.admin(['budget', 'attach', '--team', owner.team.slug, '--budget', String(id), '--pool', b.subdomain, '--reserved', '8']);

  // Σ reserved may not exceed the origin max: 5 + 8 + 8 > 20.
  const over = await run(['budget', 'attach', '--team', owner.team.slug, '--budget', String(id), '--pool', c.subdomain, '--reserved', '8']);
  t.equal(over.code, 2);
  t.match(over.stderr, /at most 7 is left/);
  // Re-attaching a pool replaces its own reservation rather than adding to it.
  await svc.admin(['budget', 'attach', '--team', owner.team.slug, '--budget', String(id), '--pool', b.subdomain, '--reserved', '10']);

  const list = await svc.api('GET', '/api/v1/budgets', { token: owner.token });
  t.equal(list.status, 200);
  t.same(list.body.data, [{ id, name: 'Shared origin', pool_ids: [a.id, b.id], origin_max_concurrent: 20, unallocated: 5 }]);
  const one = await svc.api('GET', `/api/v1/budgets/${id}`, { token: owner.token });
  t.same(one.body, { data: { id, name: 'Shared origin', pool_ids: [a.id, b.id], origin_max_concurrent: 20, unallocated: 5 } });
  const pools = await svc.api('GET', `/api/v1/budgets/${id}/pools`, { token: owner.token });
  t.equal(pools.status, 200);
  t.same(pools.body.data.map((p: { id: number; budget: unknown }) => [p.id, p.budget]), [
    [a.id, { id, name: 'Shared origin', reserved_concurrent: 5 }],
    [b.id, { id, name: 'Shared origin', reserved_concurrent: 10 }],
  ]);
  const shown = await svc.api('GET', `/api/v1/pools/${a.subdomain}`, { token: owner.token });
  t.same(shown.body.data.budget, { id, name: 'Shared origin', reserved_concurrent: 5 }, 'the pool embeds its PoolBudget');

  // A pool is in at most one budget: attaching it elsewhere moves it.
  const second = (await svc.admin(['budget', 'create', '--team', owner.team.slug, '--name', 'Second'])).budget;
  t.equal(second.origin_max_concurrent, null);
  const moved = await svc.admin(['budget', 'attach', '--team', owner.team.slug, '--budget', String(second.id), '--pool', a.subdomain, '--reserved', '50']);
  t.equal(moved.moved_from_budget_id, id);
  t.same((await svc.api('GET', `/api/v1/budgets/${id}`, { token: owner.token })).body.data.pool_ids, [b.id]);
  t.same((await svc.api('GET', `/api/v1/budgets/${id}`, { token: owner.token })).body.data.unallocated, 10);
  t.match((await svc.api('GET', `/api/v1/budgets/${second.id}`, { token: owner.token })).body.data, { pool_ids: [a.id], origin_max_concurrent: null, unallocated: 0 });

  await until('both budgets announced on the change feed', () => seen.includes(`budget:${id}`) && seen.includes(`budget:${second.id}`));
  t.pass('budget writes are announced');
});

t.test('budget abilities: budgets:read for budgets, pools:read for a budget\'s pools; another team\'s budget is 404', async (t) => {
  const p = await pool('abil.budget.example.com');
  const made = (await svc.admin(['budget', 'create', '--team', owner.team.slug, '--name', 'Abilities', '--origin-max', '4'])).budget;
  await svc.admin(['budget', 'attach', '--team', owner.team.slug, '--budget', String(made.id), '--pool', p.subdomain]);
  const mk = async (abilities: string) =>
    (await svc.admin(['token', 'create', '--team', owner.team.slug, '--user', String(owner.user.id), '--abilities', abilities])).token as string;
  const budgetsOnly = await mk('budgets:read');
  const poolsOnly = await mk('pools:read');

  t.equal((await svc.api('GET', '/api/v1/budgets', { token: budgetsOnly })).status, 200);
  t.equal((await svc.api('GET', `/api/v1/budgets/${made.id}`, { token: budgetsOnly })).status, 200);
  t.equal((await svc.api('GET', `/api/v1/budgets/${made.id}/pools`, { token: budgetsOnly })).status, 403);
  t.equal((await svc.api('GET', '/api/v1/budgets', { token: poolsOnly })).status, 403);
  t.equal((await svc.api('GET', `/api/v1/budgets/${made.id}`, { token: poolsOnly })).status, 403);
  const viaPools = await svc.api('GET', `/api/v1/budgets/${made.id}/pools`, { token: poolsOnly });
  t.equal(viaPools.status, 200);
  t.same(viaPools.body.data.map((x: { id: number }) => x.id), [p.id]);

  for (const path of [`/api/v1/budgets/${made.id}`, `/api/v1/budgets/${made.id}/pools`, '/api/v1/budgets/999999', '/api/v1/budgets/abc']) {
    t.equal((await svc.api('GET', path, { token: other.token })).status, 404, path);
  }
  t.same((await svc.api('GET', '/api/v1/budgets', { token: other.token })).body, { data: [] });
});

t.test('admin budget commands: --help, usage errors, other teams\' budgets and pools', async (t) => {
  for (const cmd of [['budget', 'create'], ['budget', 'attach']]) {
    const help = await run([...cmd, '--help']);
    t.equal(help.code, 0);
    t.match(help.stdout, new RegExp(`usage: poolgate admin ${cmd.join(' ')} --team`));
  }
  t.match((await run(['--help'])).stdout, /budget attach/);

  t.equal((await run(['budget', 'create', '--team', owner.team.slug])).code, 2, 'name is required');
  t.equal((await run(['budget', 'create', '--team', owner.team.slug, '--name', 'X', '--origin-max', '0'])).code, 2);
  t.equal((await run(['budget', 'create', '--team', 'no-such-team', '--name', 'X'])).code, 2);
  await svc.admin(['budget', 'create', '--team', owner.team.slug, '--name', 'Dup']);
  const dup = await run(['budget', 'create', '--team', owner.team.slug, '--name', 'Dup']);
  t.equal(dup.code, 2);
  t.match(dup.stderr, /already exists/);

  const mine = await pool('cli.budget.example.com');
  const theirs = await pool('cli.budget.example.com', other.token);
  const theirBudget = (await svc.admin(['budget', 'create', '--team', other.team.slug, '--name', 'Theirs'])).budget;
  const myBudget = (await svc.admin(['budget', 'create', '--team', owner.team.slug, '--name', 'Mine'])).budget;
  const cross = await run(['budget', 'attach', '--team', owner.team.slug, '--budget', String(theirBudget.id), '--pool', mine.subdomain]);
  t.equal(cross.code, 2);
  t.match(cross.stderr, /budget \d+ not found/);
  const crossPool = await run(['budget', 'attach', '--team', owner.team.slug, '--budget', String(myBudget.id), '--pool', theirs.subdomain]);
  t.equal(crossPool.code, 2);
  t.match(crossPool.stderr, /pool .* not found/);
  t.equal((await run(['budget', 'attach', '--team', owner.team.slug, '--budget', String(myBudget.id), '--pool', mine.subdomain, '--reserved', '-1'])).code, 2);
});
