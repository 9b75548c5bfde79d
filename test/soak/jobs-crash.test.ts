// The full run of test/jobs-crash.test.ts: SIGKILL with 1,000 jobs in flight (the default suite spills 200).
process.env.POOLGATE_SOAK = '1';
await import('../jobs-crash.test.js');
