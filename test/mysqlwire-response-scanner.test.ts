// The response scanner reads a packet where it lies when the packet is whole in one chunk, and gathers its
// header and head across chunks otherwise. Both ways must find the same end and the same status flags: each
// answer here is fed whole, cut at every offset, and one byte at a time, with bytes of the next answer after it.
import t from 'tap';
import { ResponseScanner, type ResponseKind } from '../src/db/mysqlwire/response-scanner.js';
import { STATUS, frame } from '../src/db/mysqlwire/packets.js';

const pkt = (seq: number, ...bytes: number[]): Buffer => frame(seq, Buffer.from(bytes));
const eof = (seq: number, status: number): Buffer => pkt(seq, 0xfe, 0, 0, status & 0xff, status >> 8);
/** A column definition's bytes matter not to the scanner: any payload not starting 0xfe/0xff. */
const col = (seq: number): Buffer => frame(seq, Buffer.from('\x03def\x02db\x01t\x01t\x02id\x02id\x0c?\x00\x0b\x00\x00\x00\x03\x00\x00\x00\x00\x00', 'latin1'));
const row = (seq: number, v: string): Buffer => frame(seq, Buffer.concat([Buffer.from([v.length]), Buffer.from(v)]));
const ok = (seq: number, status: number, affected = 0): Buffer => pkt(seq, 0x00, affected, 0, status & 0xff, status >> 8, 0, 0);

interface Case {
  name: string;
  kind: ResponseKind;
  answer: Buffer;
  status: number;
  error: boolean;
}

const inTrans = STATUS.AUTOCOMMIT | STATUS.IN_TRANS;
const rows = Array.from({ length: 100 }, (_, i) => row(4 + i, `row-${i}-${'x'.repeat(i % 30)}`));
const cases: Case[] = [
  { name: 'OK', kind: 'result', answer: ok(1, inTrans, 3), status: inTrans, error: false },
  { name: 'ERR keeps the status before it', kind: 'result', answer: frame(1, Buffer.from('\xff\x7a\x04#42S02no such table', 'latin1')), status: STATUS.AUTOCOMMIT, error: true },
  { name: 'a result set of 100 rows', kind: 'result', answer: Buffer.concat([pkt(1, 1), col(2), eof(3, inTrans), ...rows, eof(104, inTrans)]), status: inTrans, error: false },
  {
    name: 'two results (MORE_RESULTS), then OK',
    kind: 'result',
    answer: Buffer.concat([pkt(1, 1), col(2), eof(3, STATUS.AUTOCOMMIT), row(4, 'a'), eof(5, STATUS.AUTOCOMMIT | STATUS.MORE_RESULTS), ok(6, STATUS.AUTOCOMMIT | STATUS.IN_TRANS)]),
    status: STATUS.AUTOCOMMIT | STATUS.IN_TRANS,
    error: false,
  },
  { name: 'column count 0xfc (two-byte)', kind: 'result', answer: Buffer.concat([pkt(1, 0xfc, 2, 0), col(2), col(3), eof(4, 0), row(5, 'a'), eof(6, STATUS.AUTOCOMMIT)]), status: STATUS.AUTOCOMMIT, error: false },
  { name: 'prepare: 2 params, 1 column', kind: 'prepare', answer: Buffer.concat([pkt(1, 0, 7, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0), col(2), col(3), eof(4, 2), col(5), eof(6, 2)]), status: STATUS.AUTOCOMMIT, error: false },
  { name: 'single: EOF status', kind: 'single', answer: eof(1, inTrans), status: inTrans, error: false },
  { name: 'fields', kind: 'fields', answer: Buffer.concat([col(1), col(2), eof(3, 2)]), status: STATUS.AUTOCOMMIT, error: false },
];

/** Feeds `chunks` as a server connection does; the end (offset in the whole stream), status and error. */
function scan(kind: ResponseKind, chunks: Buffer[]): { end: number; status: number; error: boolean } {
  const s = new ResponseScanner();
  s.start(kind, STATUS.AUTOCOMMIT);
  let before = 0;
  for (const c of chunks) {
    const end = s.feed(c, 0);
    if (end >= 0) return { end: before + end, status: s.status, error: s.error };
    before += c.length;
  }
  return { end: -1, status: s.status, error: s.error };
}

const next = ok(0, STATUS.AUTOCOMMIT);
for (const c of cases) {
  t.test(c.name, async (t) => {
    const stream = Buffer.concat([c.answer, next]);
    const whole = scan(c.kind, [stream]);
    t.same(whole, { end: c.answer.length, status: c.status, error: c.error }, 'fed whole: ends at the answer\'s last byte');
    let agree = 0;
    for (let cut = 1; cut < stream.length; cut++) {
      const r = scan(c.kind, [stream.subarray(0, cut), stream.subarray(cut)]);
      if (r.end === whole.end && r.status === whole.status && r.error === whole.error) agree++;
      else t.fail(`cut at ${cut}: ${JSON.stringify(r)}`);
    }
    t.equal(agree, stream.length - 1, 'cut at every offset: the same end and status');
    const bytes = Array.from({ length: stream.length }, (_, i) => stream.subarray(i, i + 1));
    t.same(scan(c.kind, bytes), whole, 'one byte at a time: the same');
  });
}

t.test('a column count 0xfc cut short is no protocol (the connection is dropped), whole or in pieces', async (t) => {
  const bad = pkt(1, 0xfc, 2);
  t.throws(() => scan('result', [bad]));
  t.throws(() => scan('result', [bad.subarray(0, 3), bad.subarray(3)]));
});
