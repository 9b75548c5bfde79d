// A node's Redis side, with redisUrl set: the governor every node shares, the lock API's leases in Redis and
// the HMAC nonces. The roles import this module (with `import()`) only when redisUrl is set: ioredis and what
// it brings cost ~0.15 s of CPU to load, which a node without Redis does not pay at start.
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

/** Connects the governor to `url` (config.redisUrl); the roles load this module with `import()`, only then. */
export async function startRedisNode(url: string, config: Config, log: Logger): Promise<RedisNode> {
  const governor = await redisGovernorFromConfig({ ...config, redisUrl: url }, log, SYSTEM_TIME);
  return { governor, leases: () => new RedisLeaseRegistry(governor), nonces: () => new RedisNonceStore(url) };
}

