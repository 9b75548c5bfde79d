// Preloaded (--import) into a proxy under bench/alloc.mjs: SIGUSR2 starts a window, the next SIGUSR2 ends it and
// writes to $ALLOC_OUT the bytes the isolate allocated in between and its collections. v8.GCProfiler gives each
// collection's heap size before and after it, so the allocation between two collections is the next one's
// "before" less the last one's "after"; the window's ends are read directly.
import { writeFileSync } from 'node:fs';
import v8 from 'node:v8';

let profiler = null;
let startUsed = 0;
process.on('SIGUSR2', () => {
  if (profiler === null) {
    profiler = new v8.GCProfiler();
    profiler.start();
    startUsed = v8.getHeapStatistics().used_heap_size;
    return;
  }
  const endUsed = v8.getHeapStatistics().used_heap_size;
  const { statistics } = profiler.stop();
  profiler = null;
  let allocated = 0;
  let after = startUsed;
  const counts = {};
  let pauseMs = 0;
  for (const s of statistics) {
    allocated += s.beforeGC.heapStatistics.usedHeapSize - after;
    after = s.afterGC.heapStatistics.usedHeapSize;
    counts[s.gcType] = (counts[s.gcType] ?? 0) + 1;
    pauseMs += s.cost / 1000;
  }
  allocated += endUsed - after;
  writeFileSync(process.env.ALLOC_OUT, JSON.stringify({ allocated, counts, pauseMs }));
});
