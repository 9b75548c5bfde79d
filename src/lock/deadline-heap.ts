// A binary min-heap of (deadline, item) entries: push and pop in O(log n). The lease janitor keeps one
// entry per term granted and skips entries that a renewal or release made stale (lazy deletion).

export interface DeadlineEntry<T> {
  at: number;
  item: T;
}

export class DeadlineHeap<T> {
  #a: Array<DeadlineEntry<T>> = [];

  get size(): number {
    return this.#a.length;
  }

  peek(): DeadlineEntry<T> | undefined {
    return this.#a[0];
  }

  push(at: number, item: T): void {
    const a = this.#a;
    const e = { at, item };
    let i = a.length;
    a.push(e);
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (a[parent]!.at <= at) break;
      a[i] = a[parent]!;
      i = parent;
    }
    a[i] = e;
  }

  pop(): DeadlineEntry<T> | undefined {
    const a = this.#a;
    const top = a[0];
    const last = a.pop();
    if (top === undefined || last === undefined || a.length === 0) return top;
    let i = 0;
    const n = a.length;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= n) break;
      const r = l + 1;
      const c = r < n && a[r]!.at < a[l]!.at ? r : l;
      if (a[c]!.at >= last.at) break;
      a[i] = a[c]!;
      i = c;
    }
    a[i] = last;
    return top;
  }

  /** Rebuilds the heap from the entries `keep` accepts (drops stale ones; O(n log n), run rarely). */
  compact(keep: (e: DeadlineEntry<T>) => boolean): void {
    const kept = this.#a.filter(keep);
    this.#a = [];
    kept.sort((x, y) => x.at - y.at);
    // A sorted array is a valid min-heap.
    this.#a = kept;
  }
}
