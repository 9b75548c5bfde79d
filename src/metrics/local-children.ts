// Label-bound metric children that count in plain numbers on the request path and reach prom-client's
// registry at scrape time. prom-client's own children re-hash and re-validate their labels on every inc()
// and observe() (and a histogram looks its bucket up by a number-keyed property): four of those per request
// cost ~0.9 µs, a tenth of the PostgreSQL listener's user time per transaction. These cost a few field writes.
import { Counter, type Registry } from 'prom-client';

type Labels = Record<string, string>;

export interface Inc {
  inc(value?: number): void;
}
export interface Observe {
  observe(value: number): void;
}

class CounterChild implements Inc {
  pending = 0;
  constructor(readonly labels: Labels) {}

  inc(value = 1): void {
    this.pending += value;
  }
}

/** A prom-client Counter whose bound children add their counts to it when it is collected. */
export class LocalCounter {
  readonly #children = new Map<string, CounterChild>();
  readonly counter: Counter;

  constructor(opts: { name: string; help: string; labelNames: readonly string[]; registry: Registry }) {
    const children = this.#children;
    this.counter = new Counter({
      name: opts.name,
      help: opts.help,
      labelNames: opts.labelNames,
      registers: [opts.registry],
      collect() {
        for (const c of children.values()) {
          if (c.pending === 0) continue;
          this.inc(c.labels, c.pending);
          c.pending = 0;
        }
      },
    });
  }

  /** The child of one label set (made once; keep it). */
  child(labels: Labels): Inc {
    const id = labelId(labels);
    let c = this.#children.get(id);
    if (c === undefined) {
      c = new CounterChild(labels);
      this.#children.set(id, c);
      // The series exists at 0 from now on, so increase() and rate() see its first counts (issue 20).
      this.counter.inc(labels, 0);
    }
    return c;
  }

  /** Drops a label set's series and its child. */
  remove(labels: Labels): void {
    this.#children.delete(labelId(labels));
    this.counter.remove(labels);
  }
}

class HistogramChild implements Observe {
  /** Observations per bucket (not cumulative); the last slot is above every bound. */
  readonly counts: Float64Array;
  sum = 0;
  count = 0;

  constructor(
    readonly labels: Labels,
    readonly bounds: readonly number[],
  ) {
    this.counts = new Float64Array(bounds.length + 1);
  }

  observe(value: number): void {
    if (!Number.isFinite(value)) return;
    const b = this.bounds;
    let i = 0;
    while (i < b.length && value > b[i]!) i++;
    this.counts[i]!++;
    this.sum += value;
    this.count++;
  }
}

/** What prom-client's registry reads from a metric at scrape time (the shape its own histograms give). */
interface MetricValue {
  value: number;
  labels: Labels;
  sharedLabels?: Labels;
  metricName: string;
}

/**
 * A histogram registered in a prom-client registry, its series kept by bound children. prom-client has no
 * way to add many observations to a bucket at once, so this is a metric of its own: the registry formats it
 * exactly as a prom-client Histogram (`_bucket` cumulative with `le`, `+Inf`, `_sum`, `_count`).
 */
export class LocalHistogram {
  readonly name: string;
  readonly help: string;
  readonly type = 'histogram';
  readonly aggregator = 'sum';
  readonly labelNames: readonly string[];
  readonly #bounds: readonly number[];
  readonly #children = new Map<string, HistogramChild>();

  constructor(opts: { name: string; help: string; labelNames: readonly string[]; buckets: readonly number[]; registry: Registry }) {
    this.name = opts.name;
    this.help = opts.help;
    this.labelNames = opts.labelNames;
    this.#bounds = [...opts.buckets].sort((a, b) => a - b);
    opts.registry.registerMetric(this as never);
  }

  child(labels: Labels): Observe {
    const id = labelId(labels);
    let c = this.#children.get(id);
    if (c === undefined) {
      c = new HistogramChild(labels, this.#bounds);
      this.#children.set(id, c);
    }
    return c;
  }

  remove(labels: Labels): void {
    this.#children.delete(labelId(labels));
  }

  reset(): void {
    this.#children.clear();
  }

  get(): { name: string; help: string; type: string; aggregator: string; values: MetricValue[] } {
    const values: MetricValue[] = [];
    const bucket = `${this.name}_bucket`;
    for (const c of this.#children.values()) {
      // A series appears once it has an observation, as prom-client's do.
      if (c.count === 0) continue;
      let acc = 0;
      for (let i = 0; i < this.#bounds.length; i++) {
        acc += c.counts[i]!;
        values.push({ value: acc, labels: { le: String(this.#bounds[i]) }, sharedLabels: c.labels, metricName: bucket });
      }
      values.push({ value: c.count, labels: { le: '+Inf' }, sharedLabels: c.labels, metricName: bucket });
      values.push({ value: c.sum, labels: {}, sharedLabels: c.labels, metricName: `${this.name}_sum` });
      values.push({ value: c.count, labels: {}, sharedLabels: c.labels, metricName: `${this.name}_count` });
    }
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }
}

/** A label set's identity regardless of key order. */
function labelId(labels: Labels): string {
  return Object.keys(labels)
    .sort()
    .map((k) => `${k}\0${labels[k]}`)
    .join('\0');
}
