// The full run of test/pgwire-fuzz.test.ts: 10,000 frames (the default suite writes 1,500).
process.env.POOLGATE_SOAK = '1';
await import('../pgwire-fuzz.test.js');
