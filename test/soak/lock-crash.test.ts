// The full run of test/lock-crash.test.ts: 10,000 leases from crashing clients (the default suite takes 1,000).
process.env.POOLGATE_SOAK = '1';
await import('../lock-crash.test.js');
