// The Redis governor's Lua scripts: every admission decision runs inside Redis as one atomic script over keys
// that share one hash tag ({p:<poolId>} or {b:<budgetId>}), so a script touches one Cluster slot.
import { createHash } from 'node:crypto';

export interface Script {
  readonly name: string;
  readonly source: string;
  readonly sha: string;
}

function script(name: string, source: string): Script {
  return { name, source, sha: createHash('sha1').update(source).digest('hex') };
}

// Time comes from Redis (TIME), not from the nodes, so every node judges lease deadlines on one clock.
const NOW = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`;

/**
 * Acquire one slot of a pool.
 * KEYS: 1 slots (zset lease id → deadline), 2 effective limit (string), 3 line (zset node → joined at),
 *       4 line liveness (zset node → expiry), 5 RPM gate (hash: rpm per minute, tokens, at), 6 pause (a key
 *       that lives as long as the upstream asked us to wait), 7.. slots of the budget's other member pools.
 * ARGV: 1 lease id, 2 term ms, 3 max concurrent, 4 node id, 5 mode (0 fail fast, 1 newcomer that may wait,
 *       2 queued waiter), 6 line ttl ms, 7 node still has waiters after this admission (1/0),
 *       8 budget origin max (absent: no budget cap), 9 this pool's reserve, 10.. reserves of KEYS[7..].
 * Returns {admitted 1/0, pool in-flight after, effective limit, lease deadline (ms, Redis clock),
 *          ms until the RPM gate opens (0: the gate did not refuse)}.
 *
 * The RPM gate is one token bucket per pool shared by every node: `rpm` per minute, holding at most one
 * second of it (at least one request), refilled from the time of the last take; a slot is taken only with
 * a token. A pause (retry hint, spent window) shuts it for the pause key's remaining life.
 *
 * The line makes nodes take turns: a node may take a slot only when more slots are free than nodes queued
 * ahead of it; a node served goes to the back of the line. Expired leases (a dead node's) and expired line
 * entries (a dead node's waiters) are dropped first, so they cost one term at most.
 */
export const ACQUIRE = script(
  'acquire',
  `${NOW}
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
if #gone > 0 then
  redis.call('ZREM', KEYS[3], unpack(gone))
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
end
local count = redis.call('ZCARD', KEYS[1])
local limit = tonumber(ARGV[3])
local eff = tonumber(redis.call('GET', KEYS[2]) or '')
if eff and eff < limit then limit = eff end
if limit < 0 then limit = 0 end
local node = ARGV[4]
local mode = tonumber(ARGV[5])
local ahead = redis.call('ZRANK', KEYS[3], node)
local inline = ahead ~= false
if not inline then ahead = redis.call('ZCARD', KEYS[3]) end
local ttl = tonumber(ARGV[6])
local gate = redis.call('PTTL', KEYS[6])
if gate < 0 then gate = 0 end
local rpm = tonumber(redis.call('HGET', KEYS[5], 'rpm') or '')
local tokens
if rpm and rpm > 0 then
  local rate = rpm / 60000
  local cap = math.max(1, rpm / 60)
  tokens = tonumber(redis.call('HGET', KEYS[5], 'tokens') or '')
  local at = tonumber(redis.call('HGET', KEYS[5], 'at') or '')
  if not tokens or not at then tokens = cap else tokens = math.min(cap, tokens + math.max(0, now - at) * rate) end
  if tokens < 1 then gate = math.max(gate, math.ceil((1 - tokens) / rate)) end
end
if gate > 0 then
  if mode > 0 then
    redis.call('ZADD', KEYS[3], 'NX', now, node)
    redis.call('ZADD', KEYS[4], now + ttl, node)
  end
  return {0, count, limit, 0, gate}
end
local ok = count + ahead < limit
local bmax = tonumber(ARGV[8] or '-1')
if ok and bmax >= 0 then
  local reserved = tonumber(ARGV[9])
  local total = count
  local borrowed = math.max(0, count - reserved)
  local rsum = reserved
  for i = 7, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    local c = redis.call('ZCARD', KEYS[i])
    local r = tonumber(ARGV[i + 3])
    total = total + c
    borrowed = borrowed + math.max(0, c - r)
    rsum = rsum + r
  end
  ok = total < bmax and (count < reserved or borrowed < math.max(0, bmax - rsum))
end
if ok then
  local deadline = now + tonumber(ARGV[2])
  redis.call('ZADD', KEYS[1], deadline, ARGV[1])
  if tokens then redis.call('HSET', KEYS[5], 'tokens', tokens - 1, 'at', now) end
  if ARGV[7] == '1' then
    redis.call('ZADD', KEYS[3], now, node)
    redis.call('ZADD', KEYS[4], now + ttl, node)
  elseif inline then
    redis.call('ZREM', KEYS[3], node)
    redis.call('ZREM', KEYS[4], node)
  end
  return {1, count + 1, limit, deadline, 0}
end
if mode > 0 then
  redis.call('ZADD', KEYS[3], 'NX', now, node)
  redis.call('ZADD', KEYS[4], now + ttl, node)
end
return {0, count, limit, 0, 0}
`,
);

/**
 * Release one lease; wakes waiting nodes (pub/sub) only when a slot was really freed and somebody waits.
 * KEYS: 1 slots, 2 line. ARGV: 1 lease id, 2 channel, 3 message, 4 always publish (1: budget pools, whose
 * waiters may sit in another pool's line). Returns {removed 1/0, pool in-flight after}.
 */
export const RELEASE = script(
  'release',
  `
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if removed == 1 and (ARGV[4] == '1' or redis.call('EXISTS', KEYS[2]) == 1) then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return {removed, redis.call('ZCARD', KEYS[1])}
`,
);

/**
 * Keeps the leases of a live node alive: every lease it still holds gets deadline now + term. A lease that
 * is missing (Redis restarted empty) is written back, because that request really is still in flight.
 * KEYS: 1 slots. ARGV: 1 term ms, 2.. lease ids. Returns how many leases had to be written back.
 */
export const REFRESH = script(
  'refresh',
  `${NOW}
local deadline = now + tonumber(ARGV[1])
local added = 0
for i = 2, #ARGV do
  added = added + redis.call('ZADD', KEYS[1], deadline, ARGV[i])
end
return added
`,
);

/**
 * Moves one lease's deadline (the lock API's renew, from any node). Never revives a lease that is gone.
 * KEYS: 1 slots. ARGV: 1 lease id, 2 new deadline (Unix ms). Returns 1 when renewed, 0 when gone.
 */
export const RENEW = script(
  'renew',
  `${NOW}
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', tonumber(ARGV[2]), ARGV[1])
return 1
`,
);

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
 * Shuts a pool's RPM gate for `ms` on every node (an upstream retry hint or a spent window); a longer pause
 * already set stays. KEYS: 1 pause. ARGV: 1 ms.
 */
export const PAUSE = script(
  'pause',
  `
local ms = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < ms then redis.call('SET', KEYS[1], '1', 'PX', ms) end
return 1
`,
);

/**
 * Publishes a pool's RPM gate rate (per minute) for every node; tokens already earned are kept within the
 * new capacity. ARGV 1 empty removes the gate. KEYS: 1 gate hash. ARGV: 1 rpm, 2 ttl ms.
 */
export const SET_RPM = script(
  'set-rpm',
  `
if ARGV[1] == '' then
  redis.call('DEL', KEYS[1])
  return 1
end
local rpm = tonumber(ARGV[1])
local cap = math.max(1, rpm / 60)
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or '')
if tokens and tokens > cap then redis.call('HSET', KEYS[1], 'tokens', cap) end
redis.call('HSET', KEYS[1], 'rpm', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`,
);

export const SCRIPTS = [ACQUIRE, RELEASE, REFRESH, RENEW, RENEW_CAPPED, PAUSE, SET_RPM] as const;
