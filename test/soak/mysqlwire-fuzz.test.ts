// The full run of test/mysqlwire-fuzz.test.ts: 10,000 packets (the default suite writes 1,500).
process.env.POOLGATE_SOAK = '1';
await import('../mysqlwire-fuzz.test.js');
