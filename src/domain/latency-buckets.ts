// Fixed latency buckets for the per-minute rollups: counting a value is a short scan and one increment,
// and histograms of the same pool-minute add element-wise, so p50/p95 come from merged counts at read time.

/** Upper bounds in ms; bucket i counts values <= LATENCY_BOUNDS_MS[i], the last bucket everything above. */
export const LATENCY_BOUNDS_MS: readonly number[] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000];
export const LATENCY_BUCKETS = LATENCY_BOUNDS_MS.length + 1;

export function bucketOf(ms: number): number {
  let i = 0;
  while (i < LATENCY_BOUNDS_MS.length && ms > LATENCY_BOUNDS_MS[i]!) i++;
  return i;
}

/**
 * The q-quantile (0 < q < 1) of a bucket histogram in ms, interpolated linearly inside its bucket; null
 * when empty. The overflow bucket answers its lower bound (the histogram knows nothing above it).
 */
export function quantileMs(hist: readonly number[] | null, q: number): number | null {
  if (hist === null) return null;
  let total = 0;
  for (const c of hist) total += c;
  if (total === 0) return null;
  const rank = q * total;
  let seen = 0;
  for (let i = 0; i < hist.length; i++) {
    const c = hist[i]!;
    if (c > 0 && seen + c >= rank) {
      const lo = i === 0 ? 0 : LATENCY_BOUNDS_MS[i - 1]!;
      if (i >= LATENCY_BOUNDS_MS.length) return lo;
      const hi = LATENCY_BOUNDS_MS[i]!;
      return Math.round((lo + ((rank - seen) / c) * (hi - lo)) * 100) / 100;
    }
    seen += c;
  }
  return LATENCY_BOUNDS_MS[LATENCY_BOUNDS_MS.length - 1]!;
}
