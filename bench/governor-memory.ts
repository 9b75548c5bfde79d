// Micro-benchmark of the memory governor's hot path: synchronous acquire + release pairs per second.
// Run: npx tsx bench/governor-memory.ts  (env N = pairs per round, default 5,000,000)
import { MemoryGovernor } from '../src/governor/memory.js';

const N = Number(process.env.N ?? 5_000_000);

function round(label: string, gov: MemoryGovernor, poolId: number): void {
  const start = process.hrtime.bigint();
  for (let i = 0; i < N; i++) {
    const a = gov.acquire({ poolId, waitMs: 0 });
    if (a instanceof Promise || !a.ok) throw new Error('expected a free slot');
    a.permit.release();
  }
  const s = Number(process.hrtime.bigint() - start) / 1e9;
  console.log(`${label}: ${(N / s / 1e6).toFixed(2)} M pairs/s (${N} in ${s.toFixed(2)} s)`);
}

const gov = new MemoryGovernor();
gov.configure(
  [
    { poolId: 1, maxConcurrent: 100, queueLength: 100, queueTimeoutMs: 1000, budgetId: null, reservedConcurrent: 0 },
    { poolId: 2, maxConcurrent: 100, queueLength: 100, queueTimeoutMs: 1000, budgetId: 9, reservedConcurrent: 10 },
    { poolId: 3, maxConcurrent: 100, queueLength: 100, queueTimeoutMs: 1000, budgetId: 9, reservedConcurrent: 10 },
  ],
  [{ budgetId: 9, originMaxConcurrent: 50 }],
);
for (let r = 0; r < 3; r++) {
  round('standalone pool', gov, 1);
  round('pool in a budget', gov, 2);
}
await gov.close();
