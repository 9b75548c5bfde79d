// Seen HMAC nonces in Redis (SET NX PX), shared by every node: a replay to another node is caught. One key per
// nonce, so a Cluster spreads them over its slots.
import type { RedisTarget } from '../config/redis-target.js';
import { connectRedis, endClient, type RedisClient } from '../governor/redis-connect.js';
import type { NonceClaim, NonceStore } from './nonce-store.js';

export class RedisNonceStore implements NonceStore {
  readonly #redis: RedisClient;

  constructor(target: RedisTarget | string) {
    // Connected at the first claim, so a node with no signed pools opens no connection. One retry, then the
    // claim fails and the caller answers 503 (a replay check that cannot run must not admit).
    this.#redis = connectRedis(typeof target === 'string' ? { kind: 'single', url: target } : target, { maxRetriesPerRequest: 1, lazyConnect: true });
    this.#redis.on('error', () => {
      /* reported per claim */
    });
  }

  async claim(id: string, ttlMs: number): Promise<NonceClaim> {
    const r = await this.#redis.set(`poolgate:nonce:${id}`, '1', 'PX', Math.max(1, Math.ceil(ttlMs)), 'NX');
    return r === 'OK' ? 'fresh' : 'seen';
  }

  async close(): Promise<void> {
    await endClient(this.#redis);
  }
}
