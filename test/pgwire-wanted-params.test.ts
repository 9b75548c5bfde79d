// A server connection remembers the wanted-parameters map it was last found to match (ServerConn.settledFor)
// and skips the compare when the next client brings the same map object. So clients of a pool that want the
// same values must get the same object: pgbench's sixteen clients (each sends application_name) otherwise
// paid a map compare per transaction.
import t from 'tap';
import { ServerPool, type ServerPoolOptions } from '../src/db/pgwire/server-pool.js';
import { UpstreamPool } from '../src/db/upstream-pool.js';
import { setupQuery } from '../src/db/pgwire/session-params.js';

// No connection is opened here: only the pool's parameter bookkeeping is used.
const pool = new ServerPool('sig', { up: new UpstreamPool(1, 60_000) } as ServerPoolOptions);
pool.params = new Map([
  ['application_name', ''],
  ['TimeZone', 'Etc/UTC'],
  ['client_encoding', 'UTF8'],
  ['server_version', '16.4'],
]);

t.test('equal login values give one shared map; different ones do not', async (t) => {
  const a = pool.wanted(new Map([['application_name', 'pgbench']]));
  const b = pool.wanted(new Map([['application_name', 'pgbench']]));
  const c = pool.wanted(new Map([['application_name', 'other']]));
  t.equal(a, b, 'same object for the same values');
  t.not(a, c);
  t.same([...a], [['application_name', 'pgbench'], ['client_encoding', 'UTF8'], ['TimeZone', 'Etc/UTC']], 'tracked parameters only');
  t.equal(pool.wanted(new Map()), pool.wanted(new Map()), 'clients that set nothing share the defaults');
  t.equal(setupQuery(a, a), null, 'a connection that matches needs no SET');
});

t.test('a client whose own SET changes a value moves to the shared map of the new values', async (t) => {
  const before = pool.wanted(new Map([['application_name', 'x']]));
  // What ClientConn does when the server reports its SET (maps are replaced, never changed in place).
  const changed = pool.shared(new Map(before).set('application_name', 'pgbench'));
  t.equal(changed, pool.wanted(new Map([['application_name', 'pgbench']])));
  t.equal(before.get('application_name'), 'x', 'the old map is untouched');
});
