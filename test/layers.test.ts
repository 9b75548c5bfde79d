// Issue 19 §2: the top-level folders of src/ form layers. Reads every relative import in src/ and fails on
// an import of dataplane/ from the modules the data plane itself uses (pool-request, jobs, policies, db,
// lock), and on any cycle between top-level folders (a file directly under src/ counts as its own node).
// The cycles that predated the layering were listed as back edges; issue 28 §2 removed the last of them
// (the domain's types and validators moved to src/domain/, the job runner takes its SQL runner as a
// function), so the list is empty and stays so: the test also fails when a listed edge is gone.
import t from 'tap';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fromRoot } from '../src/config/paths.js';

const root = fromRoot('src');

/** Known back edges (from → to), removed from the graph before it is checked for cycles. */
const KNOWN_BACK_EDGES: Record<string, string> = {};

/** Issue 28 §2: the domain's types and validators (pools, keys, abilities, settings, budgets, webhooks). */
const DOMAIN = 'domain';

/** Folders that the data plane imports, so they must never import it back. */
const BELOW_DATAPLANE = ['pool-request', 'jobs', 'policies', 'db', 'lock'];

function sourceFiles(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...sourceFiles(p));
    else if (e.name.endsWith('.ts')) out.push(p);
  }
  return out;
}

/** The node a file belongs to: its top-level folder, or its own name directly under src/. */
function nodeOf(file: string): string {
  const parts = relative(root, file).split(sep);
  return parts[0]!;
}

const IMPORT = /(?:^|\n)\s*(?:import|export)\b[^'"]*?from\s*'(\.[^']+)'|import\(\s*'(\.[^']+)'\s*\)/g;

/** Edges between nodes, each with the imports that make it. */
const edges = new Map<string, string[]>();
for (const file of sourceFiles(root)) {
  const text = readFileSync(file, 'utf8');
  for (const m of text.matchAll(IMPORT)) {
    const spec = (m[1] ?? m[2])!;
    const target = resolve(dirname(file), spec);
    if (!target.startsWith(root + sep)) continue;
    const from = nodeOf(file);
    const to = nodeOf(target);
    if (from === to) continue;
    const key = `${from} -> ${to}`;
    const list = edges.get(key) ?? [];
    list.push(`${relative(root, file)} imports ${spec}`);
    edges.set(key, list);
  }
}

t.test('the scan sees the imports it checks', async (t) => {
  t.ok(edges.has('dataplane -> pool-request'), 'dataplane imports the shared core');
  t.ok(edges.has('service.ts -> dataplane'), 'the service wiring imports the data plane');
});

t.test('the domain module imports no other part of src/, and the layers above it use it', async (t) => {
  const out = [...edges.entries()].filter(([key]) => key.startsWith(`${DOMAIN} -> `));
  t.same(out, [], 'domain/ depends on packages only');
  for (const user of ['control', 'store', 'policies', 'dataplane']) t.ok(edges.has(`${user} -> ${DOMAIN}`), `${user}/ imports domain/`);
});

t.test('nothing the data plane uses imports dataplane/', async (t) => {
  for (const folder of BELOW_DATAPLANE) {
    t.same(edges.get(`${folder} -> dataplane`) ?? [], [], `${folder}/ does not import dataplane/`);
  }
});

t.test('no cycle between top-level folders beyond the known back edges', async (t) => {
  for (const known of Object.keys(KNOWN_BACK_EDGES)) {
    t.ok(edges.has(known), `the known back edge ${known} still exists (remove it from the list once it is gone)`);
  }
  const next = new Map<string, string[]>();
  for (const key of edges.keys()) {
    if (key in KNOWN_BACK_EDGES) continue;
    const [from, to] = key.split(' -> ') as [string, string];
    next.set(from, [...(next.get(from) ?? []), to]);
  }
  // Depth-first search; a node met again while still on the path closes a cycle.
  const state = new Map<string, 'open' | 'done'>();
  const cycles: string[] = [];
  const visit = (node: string, path: string[]): void => {
    state.set(node, 'open');
    for (const to of next.get(node) ?? []) {
      if (state.get(to) === 'open') {
        const cycle = [...path.slice(path.indexOf(to)), node, to];
        const steps = cycle.slice(1).map((n, i) => `${cycle[i]} -> ${n}: ${(edges.get(`${cycle[i]} -> ${n}`) ?? [])[0]}`);
        cycles.push(steps.join('\n'));
      } else if (!state.has(to)) {
        visit(to, [...path, node]);
      }
    }
    state.set(node, 'done');
  };
  for (const node of next.keys()) if (!state.has(node)) visit(node, []);
  t.same(cycles, [], 'no cycle');
});

t.test('a node without redisUrl does not load the Redis client (the roles import src/roles/redis.ts only with it), nor one without a MySQL client mysql2', async (t) => {
  const { execFileSync } = await import('node:child_process');
  const script = `import { createRequire } from 'node:module';
    await import(${JSON.stringify(fromRoot('dist', 'src', 'service.js'))});
    const loaded = Object.keys(createRequire(import.meta.url).cache);
    process.stdout.write(JSON.stringify({ modules: loaded.length, ioredis: loaded.filter((f) => f.includes('/node_modules/ioredis/')).length, mysql2: loaded.filter((f) => f.includes('/node_modules/mysql2/')).length }));`;
  const out = JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8' }));
  t.ok(out.modules > 100, `the service's CommonJS dependencies were loaded (${out.modules} modules)`);
  t.equal(out.ioredis, 0, 'no module of ioredis');
  // mysql2 (~75 ms of CPU) is loaded at the first MySQL connection (src/db/mysql2.ts).
  t.equal(out.mysql2, 0, 'no module of mysql2');
});
