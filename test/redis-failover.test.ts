// Issue 27 item 2, short version: a Redis primary SIGKILLed under paced traffic through two dataplane
// processes per failure policy (closed and open side by side), on a Sentinel topology (primary, replica,
// three sentinels; down-after 500 ms). Measured: seconds until admissions resume, refusals (only 503
// governor_unavailable), the origin's peak concurrency before, during and after against max_concurrent,
// leases left over (zero). The Cluster scenario and longer runs are in test/soak/redis-failover.test.ts.
import t from 'tap';
import { needServer } from './helpers/servers.js';
import { failoverScenario } from './helpers/redis-failover.js';

const skip = (await needServer('postgres')) || (await needServer('redis'));

t.test('Sentinel: the primary SIGKILLed under load', { skip }, async (t) => {
  await failoverScenario(t, 'sentinel', { preMs: 800, postMs: 1000, paceMs: 10, holdMs: 40, max: 6 });
});
