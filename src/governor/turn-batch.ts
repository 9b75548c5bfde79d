// Per-key lists of work made during one event-loop turn, handed over together: the Redis governor sends each
// pool's acquires (and releases) of a turn as one script call, so several callers share one command.

export class TurnBatch<K, T> {
  readonly #lists = new Map<K, T[]>();
  readonly #send: (key: K, items: T[]) => void;
  readonly #max: number;

  /** `max` bounds one call's length (a script blocks Redis while it runs); a full list is sent at once. */
  constructor(send: (key: K, items: T[]) => void, max: number) {
    this.#send = send;
    this.#max = max;
  }

  get empty(): boolean {
    return this.#lists.size === 0;
  }

  add(key: K, item: T): void {
    const list = this.#lists.get(key);
    if (list === undefined) {
      this.#lists.set(key, [item]);
      return;
    }
    list.push(item);
    if (list.length >= this.#max) {
      this.#lists.delete(key);
      this.#send(key, list);
    }
  }

  /** Sends every list, oldest key first. */
  flush(): void {
    for (const [key, list] of this.#lists) {
      this.#lists.delete(key);
      this.#send(key, list);
    }
  }
}
