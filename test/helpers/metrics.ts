// Reads a Prometheus exposition the way the tests need it: one metric's samples, filtered by labels, summed.
import { request } from 'undici';

/** Samples of `name` from `${metricsUrl}/metrics` whose labels include all of `labels`, summed. */
export async function metricSum(metricsUrl: string, name: string, labels: Record<string, string>): Promise<number> {
  const res = await request(`${metricsUrl}/metrics`);
  const text = await res.body.text();
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`)) continue;
    if (!Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) continue;
    sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return sum;
}
