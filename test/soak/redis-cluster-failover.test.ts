// Issue 27 item 2 on a Cluster: three primaries with a replica each (node timeout 1 s); the primary of the pools'
// hash slot SIGKILLed under paced traffic through two dataplane processes per failure policy. The same scenario and
// measurements as on Sentinel (test/helpers/redis-failover.ts, test/redis-failover.test.ts).
//
// In the soak run only (issue 28 §1): the short version cost ~20 s of CPU in `npm test` (six Redis servers and four
// dataplane processes for ~2 s of traffic), the most of any file. The default suite keeps the scenario's short run
// on Sentinel (test/redis-failover.test.ts) and the Cluster's wiring, including a lease the promoted replica missed,
// in test/redis-cluster.test.ts.
import t from 'tap';
import { needServer } from '../helpers/servers.js';
import { failoverScenario } from '../helpers/redis-failover.js';
import { endIfHeldOpenAtExit } from '../helpers/redis-topology.js';

/** 5 s of traffic before the kill and 10 s after Redis is back, 200 requests a second to max_concurrent 8, as the soak run had it. */
const RUN = { preMs: 5000, postMs: 10_000, paceMs: 5, holdMs: 40, max: 8 };

const skip = (await needServer('postgres')) || (await needServer('redis'));
endIfHeldOpenAtExit(t);

t.test("Cluster: the primary of the pools' slot SIGKILLed under load", { skip }, async (t) => {
  await failoverScenario(t, 'cluster', RUN);
});
