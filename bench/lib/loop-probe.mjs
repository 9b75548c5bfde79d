// Preloaded into poolgate (`node --import bench/lib/loop-probe.mjs`) by bench/stalls.mjs: what stalls its main
// thread. On SIGUSR2 it writes, for the window since the last SIGUSR2, to $LOOP_PROBE_OUT (one JSON line
// appended): the event loop's delay histogram (perf_hooks.monitorEventLoopDelay), its utilisation, the garbage
// collections (PerformanceObserver 'gc') and every embedded-store statement that ran on this thread, timed around
// PGlite's synchronous WebAssembly call (execProtocolRawSync: the part that holds the event loop) and labelled by
// its SQL text. Nothing here changes what poolgate does; the probe's own cost is a 1 ms-resolution timer.
import { appendFileSync } from 'node:fs';
import { monitorEventLoopDelay, PerformanceObserver, performance, constants } from 'node:perf_hooks';
import { isMainThread } from 'node:worker_threads';

const out = process.env.LOOP_PROBE_OUT;
if (isMainThread && out) {
  const delay = monitorEventLoopDelay({ resolution: 1 });
  delay.enable();
  let elu = performance.eventLoopUtilization();
  let started = performance.now();
  let gcs = [];
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) gcs.push({ kind: e.detail?.kind ?? e.kind, ms: e.duration });
  }).observe({ entryTypes: ['gc'] });

  /** Per statement label: count, total and max ms of the synchronous WebAssembly calls. */
  let statements = new Map();
  let lastParse = '';
  /** A label for a protocol message batch: the SQL of a Query or Parse message, else the last Parse's. */
  const labelOf = (msg) => {
    if (!(msg instanceof Uint8Array) || msg.length < 6) return '?';
    const type = String.fromCharCode(msg[0]);
    let text = null;
    if (type === 'Q') text = Buffer.from(msg.subarray(5, msg.indexOf(0, 5))).toString('utf8');
    else if (type === 'P') {
      const nameEnd = msg.indexOf(0, 5);
      text = Buffer.from(msg.subarray(nameEnd + 1, msg.indexOf(0, nameEnd + 1))).toString('utf8');
      lastParse = text;
    }
    const sql = (text ?? lastParse).replace(/\s+/g, ' ').trim().slice(0, 90);
    return text === null ? `[${type}] ${sql}` : sql;
  };
  try {
    const { PGlite } = await import('@electric-sql/pglite');
    const raw = PGlite.prototype.execProtocolRawSync;
    PGlite.prototype.execProtocolRawSync = function (msg) {
      const label = labelOf(msg);
      const t = performance.now();
      try {
        return raw.call(this, msg);
      } finally {
        const ms = performance.now() - t;
        let s = statements.get(label);
        if (!s) statements.set(label, (s = { label, count: 0, totalMs: 0, maxMs: 0 }));
        s.count++;
        s.totalMs += ms;
        if (ms > s.maxMs) s.maxMs = ms;
      }
    };
  } catch {
    /* no PGlite here (a PostgreSQL store): statements stay empty */
  }

  const r3 = (v) => Math.round(v * 1000) / 1000;
  const kinds = { [constants.NODE_PERFORMANCE_GC_MAJOR]: 'major', [constants.NODE_PERFORMANCE_GC_MINOR]: 'minor', [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental', [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weakcb' };
  process.on('SIGUSR2', () => {
    const now = performance.now();
    const u = performance.eventLoopUtilization(elu);
    const ms = (ns) => r3(ns / 1e6);
    const gcBy = {};
    for (const g of gcs) {
      const k = kinds[g.kind] ?? String(g.kind);
      const b = (gcBy[k] ??= { count: 0, totalMs: 0, maxMs: 0 });
      b.count++;
      b.totalMs = r3(b.totalMs + g.ms);
      b.maxMs = r3(Math.max(b.maxMs, g.ms));
    }
    const stmts = [...statements.values()].sort((a, b) => b.totalMs - a.totalMs).map((s) => ({ ...s, totalMs: r3(s.totalMs), maxMs: r3(s.maxMs) }));
    const line = {
      pid: process.pid,
      window_s: r3((now - started) / 1000),
      loop_delay_ms: { p50: ms(delay.percentile(50)), p99: ms(delay.percentile(99)), p999: ms(delay.percentile(99.9)), max: ms(delay.max), mean: ms(delay.mean), samples: delay.count },
      loop_utilisation: r3(u.utilization),
      gc: gcBy,
      store: { calls: stmts.reduce((a, s) => a + s.count, 0), totalMs: r3(stmts.reduce((a, s) => a + s.totalMs, 0)), maxMs: r3(Math.max(0, ...stmts.map((s) => s.maxMs))), statements: stmts },
    };
    appendFileSync(out, `${JSON.stringify(line)}\n`);
    delay.reset();
    elu = performance.eventLoopUtilization();
    started = now;
    gcs = [];
    statements = new Map();
  });
}
