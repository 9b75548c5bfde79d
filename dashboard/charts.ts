// Per-minute charts with uPlot (a small canvas chart library, served from poolgate like every asset).
import uPlot from 'uplot';
import type { Minute } from './types.js';

export interface ChartSeries {
  label: string;
  stroke: string;
  /** The minute's value; null draws a gap (no latency measured), a count of an absent minute is 0. */
  pick: (r: Minute | undefined) => number | null;
  dash?: number[];
}

/** The charts of the Pool page: requests by outcome, queue wait and upstream latency p50/p95, effective limit. */
export const POOL_CHARTS: Array<{ id: string; title: string; unit: string; series: ChartSeries[] }> = [
  {
    id: 'chart-requests', title: 'Requests per minute', unit: 'per minute',
    series: [
      { label: 'Requests', stroke: '#4f46e5', pick: (r) => r?.requests ?? 0 },
      { label: 'Admitted', stroke: '#059669', pick: (r) => r?.admitted ?? 0 },
      { label: 'Queued', stroke: '#d97706', pick: (r) => r?.queued ?? 0 },
      { label: 'Rejected (429/504)', stroke: '#dc2626', pick: (r) => r?.rejected ?? 0 },
      { label: 'Upstream errors', stroke: '#7c3aed', pick: (r) => r?.upstream_errors ?? 0 },
    ],
  },
  {
    id: 'chart-latency', title: 'Queue wait and upstream latency', unit: 'ms',
    series: [
      { label: 'Queue wait p50', stroke: '#d97706', pick: (r) => r?.queue_wait_p50_ms ?? null },
      { label: 'Queue wait p95', stroke: '#d97706', pick: (r) => r?.queue_wait_p95_ms ?? null, dash: [6, 4] },
      { label: 'Upstream p50', stroke: '#0284c7', pick: (r) => r?.upstream_p50_ms ?? null },
      { label: 'Upstream p95', stroke: '#0284c7', pick: (r) => r?.upstream_p95_ms ?? null, dash: [6, 4] },
    ],
  },
  {
    id: 'chart-limit', title: 'Effective limit (lowest in the minute)', unit: 'slots',
    series: [{ label: 'Effective limit', stroke: '#059669', pick: (r) => r?.effective_limit ?? null }],
  },
];

export function minutesChart(el: HTMLElement, rows: Minute[], windowMs: number, title: string, unit: string, series: ChartSeries[]): uPlot {
  // Minutes without traffic are absent from the API: counts drop to 0 there, latencies leave a gap.
  const end = Math.floor(Date.now() / 60_000) * 60;
  const start = end - Math.floor(windowMs / 1000) + 60;
  const byMinute = new Map(rows.map((r) => [Math.floor(Date.parse(r.minute) / 1000), r]));
  const xs: number[] = [];
  const cols: (number | null)[][] = series.map(() => []);
  for (let t = start; t <= end; t += 60) {
    const r = byMinute.get(t);
    xs.push(t);
    series.forEach((s, i) => cols[i]!.push(s.pick(r)));
  }
  const width = Math.max(320, el.clientWidth || 640);
  return new uPlot(
    {
      title,
      width,
      height: 220,
      scales: { x: { time: true }, y: { range: (_u, _min, max) => [0, Math.max(1, max)] } },
      // The y axis is as wide as its longest tick label plus its title (5-digit counts overlapped a fixed width),
      // and the plot keeps room on the right for the last time label.
      axes: [{}, { label: unit, labelSize: 18, size: (_u: uPlot, values: string[] | null) => 18 + 12 + 8 * Math.max(2, ...(values ?? []).map((v) => v.length)) }],
      padding: [12, 28, 0, 0],
      series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.stroke, width: 2, ...(s.dash ? { dash: s.dash } : {}) }))],
    },
    [xs, ...cols] as uPlot.AlignedData,
    el,
  );
}
