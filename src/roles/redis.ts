// A node's Redis side, with a Redis configured (redisUrl, redisSentinels or redisClusterNodes): the governor
// every node shares, the lock API's leases in Redis and the HMAC nonces. Loaded only through redisSide()
// (role.ts), when Redis is configured: ioredis and what it brings cost ~0.15 s of CPU to load, which a node
// without Redis does not pay at start.
import type { Config } from '../config/schema.js';
import type { RedisTarget } from '../config/redis-target.js';
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

/** Connects the governor to the configured Redis (`target`: one server, Sentinel or Cluster). */
export async function startRedisNode(target: RedisTarget, config: Config, log: Logger): Promise<RedisNode> {
  const governor = await redisGovernorFromConfig(target, config, log, SYSTEM_TIME);
  return { governor, leases: () => new RedisLeaseRegistry(governor), nonces: () => new RedisNonceStore(target) };
}
