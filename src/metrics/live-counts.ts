// The last minute of each pool's traffic, as the dashboard's Pools page shows it: requests admitted, and
// answers of 429, 504 and other 5xx to clients. A ring of 60 one-second buckets per pool: the request
// path does one map read and a few array writes; reading sums the buckets of the last 60 seconds.

export interface LastMinute {
  admitted: number;
  status_429: number;
  status_504: number;
  status_5xx: number;
}

const SECONDS = 60;
/** Per bucket: [epoch second, admitted, 429, 504, other 5xx]. */
const WIDTH = 5;

export class LiveCounts {
  readonly #pools = new Map<number, Float64Array>();
  readonly #now: () => number;

  constructor(now: () => number = Date.now) {
    this.#now = now;
  }

  /** Counts one finished request: whether the governor admitted it and the status its client got. */
  record(poolId: number, admitted: boolean, status: number): void {
    const field = status === 429 ? 2 : status === 504 ? 3 : status >= 500 && status <= 599 ? 4 : 0;
    if (!admitted && field === 0) return;
    let ring = this.#pools.get(poolId);
    if (ring === undefined) {
      ring = new Float64Array(SECONDS * WIDTH).fill(-1, 0, 1);
      this.#pools.set(poolId, ring);
    }
    const sec = Math.floor(this.#now() / 1000);
    const at = (sec % SECONDS) * WIDTH;
    if (ring[at] !== sec) {
      ring[at] = sec;
      ring[at + 1] = ring[at + 2] = ring[at + 3] = ring[at + 4] = 0;
    }
    if (admitted) ring[at + 1]!++;
    if (field !== 0) ring[at + field]!++;
  }

  /** Sums of the last 60 seconds (the current one included). */
  lastMinute(poolId: number): LastMinute {
    const out: LastMinute = { admitted: 0, status_429: 0, status_504: 0, status_5xx: 0 };
    const ring = this.#pools.get(poolId);
    if (ring === undefined) return out;
    const now = Math.floor(this.#now() / 1000);
    for (let i = 0; i < SECONDS; i++) {
      const at = i * WIDTH;
      const sec = ring[at]!;
      if (sec <= now - SECONDS || sec > now) continue;
      out.admitted += ring[at + 1]!;
      out.status_429 += ring[at + 2]!;
      out.status_504 += ring[at + 3]!;
      out.status_5xx += ring[at + 4]!;
    }
    return out;
  }

  forget(poolId: number): void {
    this.#pools.delete(poolId);
  }
}
