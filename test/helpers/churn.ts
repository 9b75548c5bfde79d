// The slot-leak load shared by the data plane tests: requests on a pool with a reproducible mix of client
// aborts, upstream resets, slow answers and short ones, over one or more undici pools (e.g. one per thread).
import type { Pool } from 'undici';

/** Status counts (and `aborted`) of `total` requests sent by `workers` concurrent loops; `clients` take turns per loop. */
export async function churn(opts: { clients: readonly Pool[]; host: string; total: number; workers: number; seed: number; slowShare?: number; slowMs?: number }): Promise<Map<string, number>> {
  const tally = new Map<string, number>();
  const count = (k: string) => tally.set(k, (tally.get(k) ?? 0) + 1);
  const slow = 0.05 + (opts.slowShare ?? 0.01);
  let next = 0;
  // A fixed seed keeps the mix reproducible.
  let seed = opts.seed;
  const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const worker = async (w: number) => {
    while (next < opts.total) {
      next++;
      const r = rand();
      const path = r < 0.05 ? '/reset' : r < slow ? `/delay/${opts.slowMs ?? 800}` : `/delay/${Math.floor(rand() * 3)}`;
      const ac = new AbortController();
      const abortIn = rand() < 0.1 ? Math.floor(rand() * 10) : -1;
      const timer = abortIn >= 0 ? setTimeout(() => ac.abort(), abortIn) : null;
      try {
        const res = await opts.clients[w % opts.clients.length]!.request({ path, method: 'GET', headers: { host: opts.host }, signal: ac.signal });
        await res.body.dump();
        count(String(res.statusCode));
      } catch {
        count('aborted');
      } finally {
        if (timer) clearTimeout(timer);
      }
    }
  };
  await Promise.all(Array.from({ length: opts.workers }, (_, w) => worker(w)));
  return tally;
}
