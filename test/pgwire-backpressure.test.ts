// A client that stops reading holds back its server, and gets its whole result once it reads again: the
// listener's writes to the client (src/db/direct-writes.ts) report a write the kernel could not take at
// once, the server connection stops being read until it is done, and PostgreSQL waits on ClientWrite.
import t from 'tap';
import pg from 'pg';
import type { Socket } from 'node:net';
import { needServer } from './helpers/servers.js';
import { startWirePool } from './helpers/pgwire.js';
import { until } from './helpers/until.js';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  const w = await startWirePool({ maxConcurrent: 2 });
  t.teardown(() => w.close());

  t.test('a client that stops reading a large result gets all of it, in order, once it reads again', async (t) => {
    const c = new pg.Client(w.clientConfig());
    c.on('error', () => {});
    await c.connect();
    const stream = (c as unknown as { connection: { stream: Socket } }).connection.stream;
    const ROWS = 20_000;
    // About 20 MB: far more than the socket buffers between PostgreSQL, poolgate and the client hold.
    const result = c.query<{ g: number; pad: string }>({ text: `SELECT g, repeat('x', 1000) AS pad FROM generate_series(1, ${ROWS}) g` });
    stream.pause();
    // The backend blocks writing to poolgate: poolgate stopped reading it because the client's writes wait.
    await until('the backend to wait on ClientWrite', async () => {
      const r = await w.direct.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1 AND wait_event = 'ClientWrite'`,
        [w.role],
      );
      return r.rows[0]!.n === 1;
    });
    stream.resume();
    const rows = (await result).rows;
    t.equal(rows.length, ROWS, 'every row arrived');
    t.ok(rows.every((r, i) => Number(r.g) === i + 1 && r.pad.length === 1000), 'in order and whole');
    t.same((await c.query('SELECT 1 AS one')).rows, [{ one: 1 }], 'the connection goes on');
    await c.end();
  });
}
