// Per-minute charts with uPlot (a small canvas chart library, served from poolgate like every asset).
import uPlot from 'uplot';
import type { Minute } from './types.js';

export function minutesChart(el: HTMLElement, rows: Minute[], windowMs: number, title: string): uPlot {
  // Minutes without traffic are absent from the API: fill them with zeros so lines drop to 0, not interpolate.
  const end = Math.floor(Date.now() / 60_000) * 60;
  const start = end - Math.floor(windowMs / 1000) + 60;
  const byMinute = new Map(rows.map((r) => [Math.floor(Date.parse(r.minute) / 1000), r]));
  const xs: number[] = [];
  const cols: number[][] = [[], [], [], []];
  for (let t = start; t <= end; t += 60) {
    const r = byMinute.get(t);
    xs.push(t);
    cols[0]!.push(r?.requests ?? 0);
    cols[1]!.push(r?.admitted ?? 0);
    cols[2]!.push(r?.queued ?? 0);
    cols[3]!.push(r?.rejected ?? 0);
  }
  const width = Math.max(320, el.clientWidth || 640);
  const height = 240;
  return new uPlot(
    {
      title,
      width,
      height,
      scales: { x: { time: true }, y: { range: (_u, _min, max) => [0, Math.max(1, max)] } },
      axes: [{}, { label: 'per minute' }],
      series: [
        {},
        { label: 'Requests', stroke: '#4f46e5', width: 2 },
        { label: 'Admitted', stroke: '#059669', width: 2 },
        { label: 'Queued', stroke: '#d97706', width: 2 },
        { label: 'Rejected', stroke: '#dc2626', width: 2 },
      ],
    },
    [xs, ...cols],
    el,
  );
}
