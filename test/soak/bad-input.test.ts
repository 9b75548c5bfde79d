// The full run of test/bad-input.test.ts: 1,200 generated bad requests (the default suite sends 300).
process.env.POOLGATE_SOAK = '1';
await import('../bad-input.test.js');
