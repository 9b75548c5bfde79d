// The access log writes one JSON line per request (pino's format, ISO time), gathered per event-loop turn
// before they reach the file: every line must still come out whole, once, in order, and close() must
// write what is still gathered.
import t, { type Test } from 'tap';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { AccessLog, type AccessRecord } from '../src/pool-request/access-log.js';
import { DrivenGovernorTime } from './helpers/test-clock.js';
import { until } from './helpers/until.js';

const record = (i: number, over: Partial<AccessRecord> = {}): AccessRecord => ({
  pool: 'p',
  method: 'GET',
  path: `/r/${i}?q="quoted"\\`,
  status: 200,
  outcome: 'proxied',
  queuedMs: 0,
  upstreamMs: 1,
  totalMs: 2,
  keyId: 7,
  ...over,
});

/** A fresh access-log file path, removed after the test. */
function tempLogFile(t: Test): string {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-access-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return join(dir, 'access.log');
}

function lines(file: string): Array<Record<string, unknown>> {
  return readFileSync(file, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, unknown>);
}

t.test('lines written in one turn and over several turns all reach the file, whole and in order', async (t) => {
  const file = tempLogFile(t);
  const log = new AccessLog({ file, sample: 1 });
  // More than one batch in a single turn, then a few turns of a few lines each.
  for (let i = 0; i < 600; i++) log.write(record(i));
  for (let turn = 0; turn < 5; turn++) {
    await new Promise((r) => setImmediate(r));
    for (let i = 0; i < 3; i++) log.write(record(600 + turn * 3 + i));
  }
  // The last lines are still gathered: close() writes them.
  await log.close();
  const got = lines(file);
  t.equal(got.length, 615);
  t.same(
    got.map((l) => l.path),
    Array.from({ length: 615 }, (_, i) => `/r/${i}?q="quoted"\\`),
    'every path once, in order, escaped and read back as sent',
  );
  const first = got[0]!;
  t.equal(first.log, 'access');
  t.equal(first.level, 30);
  t.match(first.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, 'ISO time, as pino.stdTimeFunctions.isoTime');
  t.ok(Math.abs(Date.parse(first.time as string) - Date.now()) < 60_000, 'the time is now');
  t.equal(first.keyId, 7);
});

t.test('sampling keeps one success in N and every refusal or error', async (t) => {
  const file = tempLogFile(t);
  const log = new AccessLog({ file, sample: 4 });
  for (let i = 0; i < 40; i++) log.write(record(i));
  for (let i = 0; i < 5; i++) log.write(record(100 + i, { status: 429, outcome: 'too_many_requests' }));
  await log.close();
  const got = lines(file);
  t.equal(got.filter((l) => l.status === 200).length, 10);
  t.equal(got.filter((l) => l.status === 429).length, 5);
});

t.test('a line written after close() is dropped, not a crash; close() twice is one close', async (t) => {
  const file = tempLogFile(t);
  const log = new AccessLog({ file, sample: 1 });
  log.write(record(1));
  await log.close();
  // A request cut at shutdown settles after the log closed: writing to the ended file would throw, and from
  // the batch's immediate that would be an uncaught exception.
  log.write(record(2, { status: 502, outcome: 'upstream_unreachable' }));
  await new Promise((r) => setImmediate(r));
  await log.close();
  t.same(
    lines(file).map((l) => l.path),
    [record(1).path],
  );
});

t.test('each line is the line pino would write for the record: same fields, same order, same values', async (t) => {
  const file = tempLogFile(t);
  const log = new AccessLog({ file, sample: 1 });
  const records: AccessRecord[] = [
    record(1),
    // Strings a client chose, with everything JSON must escape; absent values; numbers JSON has no form for.
    record(2, { pool: null, method: 'GE"T', path: '/\u0000\u001f\u2028\ud83d\ude00\ud800"\\\n\t é', upstreamMs: null, keyId: null }),
    record(3, { status: 504, outcome: 'upstream_timeout', queuedMs: Number.NaN, totalMs: Number.POSITIVE_INFINITY }),
  ];
  for (const r of records) log.write(r);
  await log.close();
  const ours = readFileSync(file, 'utf8').trim().split('\n');
  // pino itself, as the access log used it before: base { log: 'access' } and an ISO time.
  const pinos: string[] = [];
  const reference = pino({ base: { log: 'access' }, timestamp: pino.stdTimeFunctions.isoTime }, { write: (s: string) => void pinos.push(s) });
  for (const r of records) reference.info(r);
  t.equal(ours.length, records.length);
  for (let i = 0; i < records.length; i++) {
    const a = JSON.parse(ours[i]!) as Record<string, unknown>;
    const b = JSON.parse(pinos[i]!) as Record<string, unknown>;
    t.same(Object.keys(a), Object.keys(b), `line ${i}: the same fields in the same order`);
    delete a.time;
    delete b.time;
    t.strictSame(a, b, `line ${i}: the same values`);
  }
});

t.test('on a quiet pool a line reaches the file within about a second, without waiting for more lines', async (t) => {
  const file = tempLogFile(t);
  // The one-second hold runs on timers the test drives: it passes when the test moves time, not after a wait.
  const time = new DrivenGovernorTime();
  const log = new AccessLog({ file, sample: 1, timers: time });
  t.teardown(() => log.close());
  const written = () => (existsSync(file) ? readFileSync(file, 'utf8') : '');
  log.write(record(1));
  // Short of the batch size: at the end of the turn the line is held, with a one-second timer.
  await until('the hold timer set', () => time.pending === 1);
  time.advance(999);
  t.equal(time.pending, 1, 'still held just short of a second');
  time.advance(1);
  t.equal(time.pending, 0, 'handed to the file at one second');
  const got = await until('the line in the file', written);
  t.same(JSON.parse(got).path, record(1).path, 'written within 1 s, while the log is still open');
  // Enough lines for a batch go out at the end of the turn, with no timer (time stands still here).
  for (let i = 2; i < 40; i++) log.write(record(i));
  await until('a full batch in the file', () => written().trim().split('\n').length === 39);
  t.equal(time.pending, 0, 'a full batch is written at once, not held');
});
