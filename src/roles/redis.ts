// A node's Redis side, with redisUrl set: the governor every node shares, the lock API's leases in Redis and
// the HMAC nonces. Loaded only through redisSide() (role.ts), when redisUrl is set: ioredis and what it brings
// cost ~0.15 s of CPU to load, which a node without Redis does not pay at start.
import type { Config } from '../config/schema.js';
import { SYSTEM_TIME } from '../governor/clock.js';
import { redisGovernorFromConfig, type RedisGovernor } from '../governor/redis.js';
import { RedisLeaseRegistry } from '../lock/redis-leases.js';
import { RedisNonceStore } from '../policies/redis-nonce-store.js';
import type { Logger } from '../log.js';

export interface RedisNode {
  readonly governor: RedisGovernor;
  leases(): RedisLeaseRegistry;
  nonces(): RedisNonceStore;
}

/** Connects the governor to config.redisUrl (`url`). */
export async function startRedisNode(url: string, config: Config, log: Logger): Promise<RedisNode> {
  const governor = await redisGovernorFromConfig(config, log, SYSTEM_TIME);
  return { governor, leases: () => new RedisLeaseRegistry(governor), nonces: () => new RedisNonceStore(url) };
}

