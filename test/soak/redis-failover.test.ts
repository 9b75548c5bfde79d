// The full run of test/redis-failover.test.ts: the Sentinel failover with 5 s of traffic before the kill and 10 s after.
process.env.POOLGATE_SOAK = '1';
await import('../redis-failover.test.js');
