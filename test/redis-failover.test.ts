// Issue 27 item 2, short version: a Redis primary SIGKILLed under paced traffic through two dataplane
// processes per failure policy, on a Sentinel topology (primary, replica, three sentinels; down-after 500 ms)
// and on a three-primary Cluster with replicas (node timeout 1 s). Measured: seconds until admissions
// resume, refusals (only 503 governor_unavailable), the origin's peak concurrency before, during and after
// against max_concurrent, leases left over (zero). The soak version (test/soak/redis-failover.test.ts) runs
// the same scenario with more traffic for longer.
import t from 'tap';
import { needServer } from './helpers/servers.js';
import { failoverScenario } from './helpers/redis-failover.js';

const skip = (await needServer('postgres')) || (await needServer('redis'));
const SHORT = { preMs: 800, postMs: 1000, paceMs: 10, holdMs: 40, max: 6 };

t.test('Sentinel: the primary SIGKILLed under load', { skip, timeout: 120_000 }, async (t) => {
  await failoverScenario(t, 'sentinel', SHORT);
});

t.test('Cluster: the primary of the pools\' slot SIGKILLed under load', { skip, timeout: 120_000 }, async (t) => {
  await failoverScenario(t, 'cluster', SHORT);
});
