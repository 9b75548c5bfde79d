// A server connection handed back while an answer to poolgate's own query is still on its way. The session-
// parameter setup (application_name and the like, sent ahead of a client's first message) is written at a
// session-mode login, and the client may leave before the server has answered it: the reset that follows
// must wait for that answer too. Counted short, the connection went back idle with the reset's last answer
// still to come, and the next client received it as the answer to its own query (node-postgres's
// client/error-handling-tests saw a pg_sleep(5) "succeed" at once, through session mode, under load).
// A proxy in front of PostgreSQL holds the server's answers and lets them through one at a time.
import t from 'tap';
import pg from 'pg';
import { needServer } from './helpers/servers.js';
import { assertNothingHeld, startHoldProxy, startWirePool, type WirePool } from './helpers/pgwire.js';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  const proxy = await startHoldProxy();
  const w: WirePool = await startWirePool({ maxConcurrent: 1, settings: { wirePoolMode: 'session' }, dbPort: proxy.port });
  t.teardown(async () => {
    await w.close();
    await proxy.close();
  });
  const listener = () => w.svc.service.pgWire!;
  const settled = async () => {
    for (let i = 0; i < 400; i++) {
      const c = listener().counts();
      if (c.clients === 0 && c.linked === 0 && c.serversOpen === c.serversIdle) return;
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error(`the listener did not settle: ${JSON.stringify(listener().counts())}`);
  };
  const client = (appName: string) => {
    const c = new pg.Client(w.clientConfig({ application_name: appName }));
    c.on('error', () => {});
    return c;
  };

  t.test('a client that leaves before its session-parameter setup is answered: the next client gets only its own answers', async (t) => {
    const a = client('first');
    await a.connect();
    t.equal((await a.query('SELECT 1 AS n')).rows[0].n, 1);
    await a.end();
    await settled();
    t.equal(listener().counts().serversOpen, 1, 'one server connection, reused by every session below');

    proxy.hold();
    // Logs in (its setup, an application_name of its own, goes to the server) and leaves at once.
    const b = client('second');
    await b.connect();
    await b.end();
    // Waits for the only server connection, which is being reset.
    const c = client('third');
    const connected = c.connect();
    await new Promise((r) => setTimeout(r, 200));
    await proxy.release(100);
    await connected;
    t.same((await c.query('SELECT 42 AS n')).rows, [{ n: 42 }], "the next client's first query gets its own answer");
    t.equal((await c.query('SHOW application_name')).rows[0].application_name, 'third', 'and its own session parameters');
    t.same((await c.query('SELECT 7 AS m')).rows, [{ m: 7 }], 'and nothing stale follows');
    await c.end();
    await settled();
  });

  t.test('nothing is left held', (t) => assertNothingHeld(t, w));
}
