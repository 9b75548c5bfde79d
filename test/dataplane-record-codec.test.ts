// A data plane thread's finished requests cross to the main thread packed (src/dataplane/threads/record-codec.ts):
// every record arrives as it was recorded, whatever its shape, and across one structured clone, as postMessage
// sends it.
import t from 'tap';
import { deserialize, serialize } from 'node:v8';
import { RecordPacker, unpackRecords, type PackedRecords } from '../src/dataplane/threads/record-codec.js';
import type { RequestRecord } from '../src/pool-request/release.js';

const SHAPES: RequestRecord[] = [
  { poolId: 1, pool: 'api', status: 200, outcome: 'proxied', admission: { ok: true, queuedMs: 0 }, waited: false, queuedMs: 0, upstreamMs: 12.5 },
  { poolId: 2, pool: 'billing', status: 429, outcome: 'rate_limited', admission: { ok: false, reason: 'queue_full', queuedMs: 0 }, waited: false, queuedMs: 0, upstreamMs: null },
  { poolId: 1, pool: 'api', status: 504, outcome: 'queue_timeout', admission: { ok: false, reason: 'queue_timeout', queuedMs: 400.25 }, waited: true, queuedMs: 400.25, upstreamMs: null },
  { poolId: 3, pool: 'search', status: 401, outcome: 'unauthorized', admission: null, waited: false, queuedMs: 0, upstreamMs: null },
  { poolId: 1, pool: 'api', status: 0, outcome: 'client_aborted', admission: { ok: true, queuedMs: 3 }, waited: true, queuedMs: 3, upstreamMs: 0 },
];

function unpacked(p: PackedRecords | null): RequestRecord[] {
  const out: RequestRecord[] = [];
  if (p !== null) unpackRecords(deserialize(serialize(p)) as PackedRecords, (r) => out.push(r));
  return out;
}

t.test('every record shape arrives as recorded', async (t) => {
  const packer = new RecordPacker(8);
  for (const r of SHAPES) packer.push(r);
  t.equal(packer.length, SHAPES.length);
  const p = packer.take();
  t.same(p?.strings.filter((s) => s === 'api').length, 1, 'a pool name is sent once a batch');
  t.strictSame(unpacked(p), SHAPES);
  t.equal(packer.take(), null, 'nothing pending after take');
});

t.test('only the admission summary crosses (the permit stays in the thread)', async (t) => {
  const packer = new RecordPacker(1);
  const permit = { release() {} };
  packer.push({ ...SHAPES[0]!, admission: { ok: true, queuedMs: 7, permit } as unknown as RequestRecord['admission'] });
  t.strictSame(unpacked(packer.take())[0]!.admission, { ok: true, queuedMs: 7 });
});

t.test('a batch larger than the capacity grows; the next batch starts with its own strings', async (t) => {
  const packer = new RecordPacker(2);
  const many = Array.from({ length: 300 }, (_, i) => ({ ...SHAPES[i % SHAPES.length]!, poolId: i }));
  for (const r of many) packer.push(r);
  t.strictSame(unpacked(packer.take()), many);
  packer.push(SHAPES[3]!);
  const next = packer.take();
  t.strictSame(next?.strings, ['search', 'unauthorized']);
  t.strictSame(unpacked(next), [SHAPES[3]]);
});
