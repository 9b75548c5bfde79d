// holdTickShape (src/runtime/tick-shape.ts): after idle major collections, a fresh nextTick tick object still has the
// map of the one held, so nextTick's literal feedback (which names that map) stays monomorphic. Runs in a child with
// V8's natives syntax and gc() exposed; the child is the real Node that runs poolgate.
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import t from 'tap';

const run = promisify(execFile);
const moduleUrl = new URL('../../src/runtime/tick-shape.js', import.meta.url).href;

const child = (hold: boolean) => `
import { createHook } from 'node:async_hooks';
import { holdTickShape, heldTickObject } from ${JSON.stringify(moduleUrl)};
${hold ? 'holdTickShape();' : ''}
const noop = () => {};
const burst = (n) => new Promise((done) => {
  const step = () => { for (let i = 0; i < 1000; i++) process.nextTick(noop); if ((n -= 1000) > 0) setImmediate(step); else setImmediate(done); };
  step();
});
await burst(100000);
// Mark-compacts with no tick object alive: without a held one, the tick map dies here.
for (let i = 0; i < 4; i++) { await new Promise((r) => setTimeout(r, 20)); globalThis.gc(); }
await burst(10000);
let fresh = null;
const hook = createHook({ init(_id, type, _trigger, resource) { if (type === 'TickObject' && fresh === null) fresh = resource; } });
hook.enable(); process.nextTick(noop); hook.disable();
const held = heldTickObject();
console.log(JSON.stringify({ held: held !== null, sameMap: held !== null && fresh !== null && %HaveSameMap(held, fresh) }));
`;

async function probe(hold: boolean): Promise<{ held: boolean; sameMap: boolean }> {
  const { stdout } = await run(process.execPath, ['--allow-natives-syntax', '--expose-gc', '--input-type=module', '-e', child(hold)]);
  return JSON.parse(stdout.trim()) as { held: boolean; sameMap: boolean };
}

t.test('a tick object made after idle major collections shares the held one\'s map', async (t) => {
  t.same(await probe(true), { held: true, sameMap: true });
});

t.test('nothing is held unless holdTickShape ran (the module does nothing on import)', async (t) => {
  t.same(await probe(false), { held: false, sameMap: false });
});
