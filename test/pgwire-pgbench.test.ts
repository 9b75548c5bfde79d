// pgbench through the PostgreSQL wire listener: its initialisation (DDL, COPY FROM STDIN, VACUUM) and bounded
// runs in simple, extended and prepared query mode with more clients than max_concurrent.
import t from 'tap';
import { needServer } from './helpers/servers.js';
import { assertNothingHeld, runTool, startWirePool, type WirePool } from './helpers/pgwire.js';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  const MAX = 3;
  const w: WirePool = await startWirePool({ maxConcurrent: MAX });
  t.teardown(() => w.close());
  const pgbenchEnv = { PGHOST: '127.0.0.1', PGPORT: String(w.port), PGUSER: 'bench', PGDATABASE: 'bench', PGPASSWORD: w.key, PGOPTIONS: `pool=${w.sub}`, PGSSLMODE: 'disable' };

  t.test('pgbench initialises its tables (DDL, COPY, VACUUM) and runs in simple, extended and prepared mode', async (t) => {
    const init = await runTool('pgbench', ['-i', '-s', '1', '-q'], { env: pgbenchEnv, timeoutMs: 120_000 });
    t.equal(init.code, 0, init.stderr);
    const rows = await w.direct.query('SELECT count(*)::int AS n FROM pgbench_accounts');
    t.equal(rows.rows[0].n, 100_000, 'pgbench_accounts filled through COPY');
    for (const mode of ['simple', 'extended', 'prepared']) {
      // pgbench prepares with a blocking PQprepare: with fewer slots than clients, one thread per client (-j 8) keeps
      // a client waiting for a slot from stalling the clients inside transactions on its thread.
      const r = await runTool('pgbench', ['-n', '-c', '8', '-j', mode === 'prepared' ? '8' : '2', '-t', '20', '-M', mode], { env: pgbenchEnv, timeoutMs: 120_000 });
      t.equal(r.code, 0, `pgbench -M ${mode}: ${r.stderr}`);
      t.match(r.stdout, /number of transactions actually processed: 160\/160/, `-M ${mode}: every transaction ran`);
      t.match(r.stdout, /number of failed transactions: 0 /, `-M ${mode}: none failed`);
    }
    const history = await w.direct.query('SELECT count(*)::int AS n FROM pgbench_history');
    t.equal(history.rows[0].n, 480, 'every read-write transaction committed its history row once');
    const s = await runTool('pgbench', ['-n', '-S', '-c', '8', '-j', '8', '-t', '50', '-M', 'prepared'], { env: pgbenchEnv, timeoutMs: 120_000 });
    t.equal(s.code, 0, s.stderr);
  });

  t.test('nothing is left held', (t) => assertNothingHeld(t, w, MAX));
}
