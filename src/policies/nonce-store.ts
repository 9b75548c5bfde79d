// Seen HMAC nonces, kept for as long as their signature could still be accepted. In the governor's
// backend: in memory (one node; bounded, expiring; here) or Redis (SET NX PX; every node shares it;
// redis-nonce-store.ts, loaded only where redisUrl is set).

/** `fresh`: first sighting (now remembered); `seen`: a replay; `full`: cannot remember more right now. */
export type NonceClaim = 'fresh' | 'seen' | 'full';

export interface NonceStore {
  /** Remembers `id` for `ttlMs` unless it is already remembered. */
  claim(id: string, ttlMs: number): NonceClaim | Promise<NonceClaim>;
  close(): Promise<void>;
}

/**
 * Map from nonce to expiry. Insertion order is close to expiry order (every TTL is bounded by the
 * signature window), so a few expired entries are dropped from the front on each claim; a full sweep
 * runs when the cap is reached. At the cap with nothing expired it answers `full` rather than forget a
 * live nonce (forgetting would reopen a replay).
 */
export class MemoryNonceStore implements NonceStore {
  readonly #seen = new Map<string, number>();
  readonly #max: number;
  readonly #clock: () => number;

  constructor(opts: { maxEntries?: number; clock?: () => number } = {}) {
    this.#max = opts.maxEntries ?? 1_000_000;
    this.#clock = opts.clock ?? Date.now;
  }

  get size(): number {
    return this.#seen.size;
  }

  claim(id: string, ttlMs: number): NonceClaim {
    const now = this.#clock();
    let dropped = 0;
    for (const [k, until] of this.#seen) {
      if (until > now || dropped >= 8) break;
      this.#seen.delete(k);
      dropped++;
    }
    const until = this.#seen.get(id);
    if (until !== undefined && until > now) return 'seen';
    if (this.#seen.size >= this.#max) {
      for (const [k, u] of this.#seen) if (u <= now) this.#seen.delete(k);
      if (this.#seen.size >= this.#max) return 'full';
    }
    this.#seen.delete(id);
    this.#seen.set(id, now + ttlMs);
    return 'fresh';
  }

  async close(): Promise<void> {
    this.#seen.clear();
  }
}
