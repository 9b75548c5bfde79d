// The full run of test/front-door-abort-load.test.ts: 20,000 requests with random client aborts (the default suite
// sends 2,000), the origin never above max_concurrent.
process.env.POOLGATE_SOAK = '1';
await import('../front-door-abort-load.test.js');
