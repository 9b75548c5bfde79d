// The full run of test/redis-cluster-failover.test.ts: the Cluster failover with 5 s of traffic before the kill and 10 s after.
process.env.POOLGATE_SOAK = '1';
await import('../redis-cluster-failover.test.js');
