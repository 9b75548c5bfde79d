// The full run of test/jobs-database.test.ts: results cut at the default 8 MiB cap (the default suite uses 512 KiB).
process.env.POOLGATE_SOAK = '1';
await import('../jobs-database.test.js');
