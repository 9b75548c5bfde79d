// The bench kit's own contracts (issue 28 item 4, issue 29): each script rewrites only its marked section of
// bench/RESULTS.md, and the paced load generator counts latency from each request's scheduled start, so a
// stall that holds requests back shows in the tail (coordinated omission, as wrk2 corrects it).
import t from 'tap';
import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

// Plain .mjs modules of the bench kit (outside the TypeScript build), from dist/test/ two folders up.
const results = await import(new URL('../../bench/lib/results.mjs', import.meta.url).href);
const { paced } = await import(new URL('../../bench/lib/paced.mjs', import.meta.url).href);

t.test('a marked section is replaced between its markers and nothing else changes', async (t) => {
  const text = [
    '# Benchmark results',
    '',
    '## Proxy',
    '',
    'hand-written intro',
    '<!-- bench:proxy-tail:start -->',
    'old figures',
    '<!-- bench:proxy-tail:end -->',
    '',
    '### Profile',
    'kept by hand',
    '',
    '## Other',
    'other section',
    '',
  ].join('\n');
  const out = results.replaceMarkedSection(text, 'proxy-tail', 'new figures\n| a | b |');
  t.equal(out, text.replace('old figures', 'new figures\n| a | b |'));
  // Idempotent: running twice gives the same file.
  t.equal(results.replaceMarkedSection(out, 'proxy-tail', 'new figures\n| a | b |'), out);
});

t.test('a section without markers yet is appended with its heading, the rest untouched', async (t) => {
  const text = '# Benchmark results\n\n## Other\nother section\n';
  const out = results.replaceMarkedSection(text, 'webhooks-floor', 'figures', 'Webhook deliveries against the floor');
  t.ok(out.startsWith(text.trimEnd()));
  t.match(out, /\n## Webhook deliveries against the floor\n\n<!-- bench:webhooks-floor:start -->\nfigures\n<!-- bench:webhooks-floor:end -->\n$/);
});

t.test('broken markers are refused, not guessed at', async (t) => {
  t.throws(() => results.replaceMarkedSection('<!-- bench:x:start -->\nno end\n', 'x', 'y'), /markers of section x are broken/);
  t.throws(() => results.replaceMarkedSection('<!-- bench:x:end -->\n<!-- bench:x:start -->\n', 'x', 'y'), /broken/);
  t.throws(() => results.replaceMarkedSection('<!-- bench:x:start -->\n<!-- bench:x:end -->\n<!-- bench:x:start -->\n<!-- bench:x:end -->\n', 'x', 'y'), /broken/);
  t.throws(() => results.replaceMarkedSection('', 'Bad Id', 'y'), /section id/);
});

t.test('every section a bench script writes has its markers in the committed RESULTS.md, once and in order', async (t) => {
  const benchDir = new URL('../../bench/', import.meta.url);
  const text = readFileSync(new URL('RESULTS.md', benchDir), 'utf8');
  const ids = new Set<string>();
  for (const file of readdirSync(benchDir).filter((f) => /\.(mjs|ts)$/.test(f))) {
    const src = readFileSync(new URL(file, benchDir), 'utf8');
    for (const m of src.matchAll(/(?:writeResults|writeMarkedSection)\(\s*'([a-z0-9:-]+)'/g)) ids.add(m[1]!);
    // One writer for every script: the heading-based writeSection is left to bench:db alone.
    if (file !== 'db.mjs') t.notMatch(src, /\bwriteSection\(/, `${file} writes a marked section, not one found by its heading`);
  }
  // bench/proxy.mjs names its sections through its modes, the webhooks script through a literal, the jobs scripts
  // (bench/lib/jobs-results.mjs) by store engine.
  for (const id of ['proxy', 'proxy-saturation', 'proxy-tail', 'webhooks', 'jobs-pglite', 'jobs-postgres', 'jobs-database-pglite', 'jobs-database-postgres']) ids.add(id);
  t.ok(ids.size >= 12, `found the scripts' section ids: ${[...ids].join(', ')}`);
  for (const id of ids) {
    t.ok(text.includes(`<!-- bench:${id}:start -->`), `RESULTS.md has the bench:${id} section`);
    // replaceMarkedSection refuses missing, doubled or swapped markers.
    t.doesNotThrow(() => results.replaceMarkedSection(text, id, 'x'), `bench:${id}'s markers are whole`);
  }
});

t.test('a run names its command: the BENCH_* settings, the script and its flags', async (t) => {
  const argv = process.argv;
  const before = process.env.BENCH_ROUNDS;
  process.argv = [argv[0]!, 'bench/x.mjs', '--write-results'];
  process.env.BENCH_ROUNDS = '5';
  t.teardown(() => {
    process.argv = argv;
    if (before === undefined) delete process.env.BENCH_ROUNDS;
    else process.env.BENCH_ROUNDS = before;
  });
  t.match(results.benchCommand('npm run bench:lock'), /(^| )BENCH_ROUNDS=5 .*npm run bench:lock -- --write-results$/);
  t.match(results.benchCommand('npx tsx bench/adaptive-sim.ts'), /npx tsx bench\/adaptive-sim\.ts --write-results$/);
});

t.test('paced latency counts from the scheduled start: a stall of the generator shows in the tail', async (t) => {
  // The 150th request (300 ms into a 1 s run at 500/s) blocks this process's event loop, the generator's too, for
  // 300 ms: about 150 requests are due during the block and go out late, all at once. Measured from when they were
  // sent they look fast; from their scheduled start each carries its share of the stall (up to ~300 ms), so p99 and
  // max must show it. The stall is set off by the run's own progress, not by a timer from the test's start: on a
  // loaded machine the run's set-up can take longer than the timer, and the stall then fell before the schedule.
  let served = 0;
  const server = createServer((_req, res) => {
    if (++served === 150) {
      const until = performance.now() + 300;
      while (performance.now() < until) {
        /* the stall */
      }
    }
    res.end('ok');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
  const r = await paced({ name: 'stall', url, rate: 500, duration: 1, connections: 8 });
  t.equal(r.errors, 0);
  t.equal(r.requests, 500);
  t.equal(r.latency_from, 'scheduled start');
  t.ok(r.latency_ms.max >= 250, `max ${r.latency_ms.max} ms carries the 300 ms stall`);
  t.ok(r.latency_ms.p99 >= 200, `p99 ${r.latency_ms.p99} ms carries the stall (~30% of requests were due during it)`);
  t.ok(r.latency_ms.p999 >= r.latency_ms.p99, 'p99.9 reported');
});
