// The lock API's Lua scripts on the Redis governor's keys: a lock lease keeps its request-deadline cap in its
// own key beside the slot (the governor names it: RedisGovernor.leaseKeys), so every node renews and ends it
// alike. Loaded on first use (the governor's runScript loads a script Redis does not know).
import { NOW, script } from '../governor/redis-scripts.js';

/**
 * The lock API's renew (any node): extends a lease by its term, never beyond its request deadline. Both are
 * kept in the lease's own key ("<requestDeadline>:<termMs>", written at the grant), so every node applies
 * the same cap. A lease past its deadline is reclaimed here, whoever asks first.
 * KEYS: 1 slots, 2 the lease's key. ARGV: 1 lease id.
 * Returns {1, new deadline} renewed, {0, 0} gone (or not a lock lease), {-1, deadline} capped (unchanged).
 */
export const RENEW_CAPPED = script(
  'renew-capped',
  `${NOW}
local score = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '')
if not score or score <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
  return {0, 0}
end
local m = redis.call('GET', KEYS[2])
if not m then return {0, 0} end
local sep = string.find(m, ':', 1, true)
local cap = tonumber(string.sub(m, 1, sep - 1))
local term = tonumber(string.sub(m, sep + 1))
if score >= cap then return {-1, score} end
local deadline = math.min(now + term, cap)
redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[1])
return {1, deadline}
`,
);

/**
 * Ends a lock lease's own key (its request-deadline cap) as the lease is released, and answers when the lease
 * was capped and what time it is on Redis's clock: a node that did not grant the lease takes its hold time
 * from these (granted at requestDeadline − the pool's request timeout). KEYS: 1 the lease's key.
 * Returns {request deadline (Unix ms) or −1 when the lease had no such key, now}.
 */
export const LEASE_END = script(
  'lease-end',
  `${NOW}
local m = redis.call('GET', KEYS[1])
if not m then return {-1, now} end
redis.call('DEL', KEYS[1])
local sep = string.find(m, ':', 1, true)
if not sep then return {-1, now} end
return {tonumber(string.sub(m, 1, sep - 1)), now}
`,
);
