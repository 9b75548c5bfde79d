// The full run of test/node-loss.test.ts: a data plane node SIGKILLed behind HAProxy, 5 s of traffic before and 10 s after.
process.env.POOLGATE_SOAK = '1';
await import('../node-loss.test.js');
