// The full run of test/dataplane-load.test.ts: 20,000 churn requests (the default suite sends 2,000).
process.env.POOLGATE_SOAK = '1';
await import('../dataplane-load.test.js');
