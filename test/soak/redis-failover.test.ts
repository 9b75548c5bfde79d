// Issue 27 item 2, soak version: the failover scenario (test/helpers/redis-failover.ts) on Sentinel and on a
// three-primary Cluster with replicas, with more traffic for longer on each side of the SIGKILL. The figures
// (one JSON comment per topology) go to bench/RESULTS.md.
import t from 'tap';
import { needServer } from '../helpers/servers.js';
import { failoverScenario } from '../helpers/redis-failover.js';

const skip = (await needServer('postgres')) || (await needServer('redis'));
const LONG = { preMs: 5000, postMs: 10_000, paceMs: 5, holdMs: 40, max: 8 };

t.test('Sentinel: the primary SIGKILLed under load', { skip }, async (t) => {
  await failoverScenario(t, 'sentinel', LONG);
});

t.test("Cluster: the primary of the pools' slot SIGKILLed under load", { skip }, async (t) => {
  await failoverScenario(t, 'cluster', LONG);
});
