// Issue 30, item 6: a client that leaves in the middle of a result is the client's leaving, not a lost
// database: no "upstream lost" warning, the server connection is cut cleanly (its statement killed), and
// the slot comes back counted as the client's abort.
import t from 'tap';
import mysql from 'mysql2';
import { pino } from 'pino';
import { needServer } from './helpers/servers.js';
import { wirePool } from './helpers/mysql-wire.js';
import { until } from './helpers/until.js';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const lines: Array<Record<string, any>> = [];
  const log = pino({ level: 'debug' }, { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, any>) });
  const w = await wirePool(t, { log });
  const governor = w.svc.service.dataplane!.governor;
  await w.setPool(2, { adaptive: false });

  t.test('a client that closes mid-result is logged as leaving (info/debug), never as "upstream lost" at warn', async (t) => {
    for (let round = 0; round < 3; round++) {
      const c = mysql.createConnection({ host: '127.0.0.1', port: w.port, user: w.sub, password: w.key, database: w.db });
      await new Promise<void>((resolve, reject) => {
        let rows = 0;
        const q = c.query("SELECT seq, REPEAT('x', 2000) AS pad FROM seq_1_to_2000000");
        q.on('result', () => {
          // Round 0: cut the socket; round 1: destroy(); round 2: the socket ends (FIN) mid-result.
          if (++rows !== 50) return;
          const s = (c as any).stream;
          if (round === 0) s.destroy();
          else if (round === 1) c.destroy();
          else s.end();
          resolve();
        });
        q.on('error', () => resolve());
        c.on('error', () => {});
        setTimeout(() => reject(new Error('no rows')), 20_000).unref();
      });
      t.ok(await until('slot back', () => governor.state(w.poolId).inFlight === 0), `round ${round}: the slot comes back`);
      t.ok(await until('server statement gone', async () => (await w.processes('%seq_1_to_2000000%')) === 0), `round ${round}: the statement does not run on upstream`);
    }
    const warns = lines.filter((l) => l.level >= 40);
    t.same(warns.map((l) => l.msg), [], 'nothing at warn or above');
    t.notOk(lines.some((l) => /upstream lost|lost connection to the database/i.test(l.msg)), 'no "upstream lost" line at any level');
    t.same((await w.connect().then(async (c) => { const r = (await c.query('SELECT 1 AS one'))[0]; await c.end(); return r; })), [{ one: 1 }], 'the pool goes on');
  });
}
