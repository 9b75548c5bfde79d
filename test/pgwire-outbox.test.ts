// The outbox (src/db/pgwire/outbox.ts) gathers a batch's frames for one write: ranges of received chunks,
// messages of our own, and frames written in place (a renamed Bind, reserve()). What it must keep: every byte
// in order, exactly once, one write per flush; memory it handed out is never written again (a write may still
// hold it); a frame written in place with the short frames around it is one run (no concat).
import t from 'tap';
import { Outbox } from '../src/db/pgwire/outbox.js';

function collecting(): { box: Outbox; writes: Buffer[] } {
  const writes: Buffer[] = [];
  return { box: new Outbox((b) => (writes.push(b), true)), writes };
}

/** Writes `bytes` into the outbox in place, as bindRenamed does. */
function inPlace(box: Outbox, bytes: Buffer): void {
  const at = box.reserve(bytes.length);
  bytes.copy(box.reserved, at);
}

t.test('a frame written in place, with the chunk\'s short frames before and after it, is one write of one run', async (t) => {
  const { box, writes } = collecting();
  const chunk = Buffer.from('PPPPPbindXXXXXDDDDDEEEEESSSSS');
  box.addRange(chunk, 0, 5);
  inPlace(box, Buffer.from('renamed-bind'));
  box.addRange(chunk, 14, 19);
  box.addRange(chunk, 19, 24);
  box.addRange(chunk, 24, 29);
  box.flush();
  t.equal(writes.length, 1);
  t.equal(writes[0]!.toString(), 'PPPPPrenamed-bindDDDDDEEEEESSSSS');
  // One run of the outbox's own memory: a view of it, not a concat of pieces.
  t.equal(writes[0]!.buffer, box.reserved.buffer);
});

t.test('memory handed to a write is never written again, across flushes and a new slab', async (t) => {
  const { box, writes } = collecting();
  const expected: string[] = [];
  for (let i = 0; i < 400; i++) {
    const frame = Buffer.from(`bind-${i}-`.padEnd(20 + (i % 13), 'x'));
    const tail = Buffer.from(`exec-${i};sync`);
    inPlace(box, frame);
    box.addRange(tail, 0, tail.length);
    box.flush();
    expected.push(frame.toString() + tail.toString());
  }
  t.same(writes.map((w) => w.toString()), expected);
});

t.test('long ranges and large frames keep their order (pieces joined at the flush)', async (t) => {
  const { box, writes } = collecting();
  const big = Buffer.alloc(3000, 0x61);
  const chunk = Buffer.concat([Buffer.from('head'), Buffer.alloc(600, 0x62), Buffer.from('tail')]);
  inPlace(box, Buffer.from('first'));
  box.addRange(chunk, 0, 604);
  inPlace(box, big);
  box.add(Buffer.from('ours'));
  box.addRange(chunk, 604, 608);
  box.flush();
  t.equal(writes.length, 1);
  t.equal(writes[0]!.toString('latin1'), 'first' + 'head' + 'b'.repeat(600) + 'a'.repeat(3000) + 'ours' + 'tail');
});

t.test('a whole chunk passed unchanged is written as the chunk itself', async (t) => {
  const { box, writes } = collecting();
  const chunk = Buffer.from('TTTTTDDDDDCCCCCZZZZZ');
  for (let i = 0; i < 20; i += 5) box.addRange(chunk, i, i + 5);
  box.flush();
  t.equal(writes[0], chunk);
});
