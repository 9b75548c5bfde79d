// Issue 20 item 9: the shipped Prometheus alert rules pass `promtool check rules` (when promtool is installed: CI
// installs it), and every poolgate metric the rules and the Grafana dashboard query is one poolgate exposes.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fromRoot } from '../src/config/paths.js';
import { PoolMetrics } from '../src/metrics/registry.js';

const root = fromRoot();
const rules = join(root, 'examples', 'prometheus', 'poolgate-alerts.yml');
const dashboard = join(root, 'examples', 'grafana', 'poolgate-dashboard.json');

/** Every series name a scrape can carry: each metric, and a histogram's _bucket, _sum and _count. */
async function exposedNames(): Promise<Set<string>> {
  const metrics = new PoolMetrics();
  const names = new Set<string>();
  for (const m of await metrics.registry.getMetricsAsJSON()) {
    names.add(m.name);
    if (m.type === 'histogram') for (const s of ['_bucket', '_sum', '_count']) names.add(m.name + s);
  }
  return names;
}

function referenced(text: string): string[] {
  return [...new Set([...text.matchAll(/\b((?:poolgate|nodejs|process)_[a-z0-9_]+)\b/g)].map((m) => m[1]!))];
}

t.test('promtool check rules is clean', async (t) => {
  const version = spawnSync('promtool', ['--version'], { encoding: 'utf8' });
  if (version.error) return t.skip('promtool is not installed (apt-get install prometheus provides it)');
  const r = spawnSync('promtool', ['check', 'rules', rules], { encoding: 'utf8' });
  t.equal(r.status, 0, `${r.stdout}${r.stderr}`);
  t.match(r.stdout, /SUCCESS: \d+ rules found/);
});

t.test('the rules and the dashboard query only metrics poolgate exposes', async (t) => {
  const names = await exposedNames();
  const dash = JSON.parse(readFileSync(dashboard, 'utf8')) as { panels: Array<{ title: string; targets: Array<{ expr: string }> }> };
  t.ok(dash.panels.length >= 8, 'a dashboard with its panels');
  const exprs = dash.panels.flatMap((p) => p.targets.map((x) => x.expr)).join('\n');
  for (const [what, text] of [['alert rules', readFileSync(rules, 'utf8')], ['dashboard', exprs]] as const) {
    const used = referenced(text);
    t.ok(used.length > 0, `${what} query metrics`);
    for (const name of used) {
      // File-name mentions (poolgate-alerts.yml) are not metrics; every other name must be exposed.
      t.ok(names.has(name), `${what}: ${name} is exposed`);
    }
  }
});
