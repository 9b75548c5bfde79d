// Issue 27 item 2, short version on a Cluster: three primaries with a replica each (node timeout 1 s); the
// primary of the pools' hash slot SIGKILLed under paced traffic through two dataplane processes per failure
// policy. The same measurements as on Sentinel (test/redis-failover.test.ts); longer in the soak suite.
import t from 'tap';
import { needServer } from './helpers/servers.js';
import { failoverScenario } from './helpers/redis-failover.js';

const skip = (await needServer('postgres')) || (await needServer('redis'));

t.test("Cluster: the primary of the pools' slot SIGKILLed under load", { skip }, async (t) => {
  await failoverScenario(t, 'cluster', { preMs: 800, postMs: 1000, paceMs: 10, holdMs: 40, max: 6 });
});
