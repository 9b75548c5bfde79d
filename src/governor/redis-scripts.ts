// The Redis governor's Lua scripts: every admission decision runs inside Redis as one atomic script over keys
// that share one hash tag ({p:<poolId>} or {b:<budgetId>}), so a script touches one Cluster slot.
import { createHash } from 'node:crypto';

export interface Script {
  readonly name: string;
  readonly source: string;
  readonly sha: string;
}

export function script(name: string, source: string): Script {
  return { name, source, sha: createHash('sha1').update(source).digest('hex') };
}

// Time comes from Redis (TIME), not from the nodes, so every node judges lease deadlines on one clock.
export const NOW = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`;

/**
 * Acquires slots of one pool for a batch of callers (the acquires one node made in one event-loop turn), in
 * order, each decided exactly as if it ran alone right after the one before it: one script call is one
 * round trip for every caller in it, and Redis runs nothing else in between.
 * KEYS: 1 slots (zset lease id → deadline), 2 effective limit (string), 3 line (zset node → joined at),
 *       4 line liveness (zset node → expiry), 5 RPM gate (hash: rpm per minute, tokens, at), 6 pause (a key
 *       that lives as long as the upstream asked us to wait), 7.. slots of the budget's other member pools.
 * ARGV: 1 node id, 2 line ttl ms, 3 max concurrent, 4 n callers, then 4 per caller: lease id, term ms, mode
 *       (0 fail fast, 1 newcomer that may wait, 2 queued waiter), node still has waiters after this
 *       admission (1/0); then, for a pool in a capped budget: budget origin max, this pool's reserve,
 *       reserves of KEYS[7..].
 * Returns {pool in-flight after the batch, effective limit, then one answer per caller: its lease deadline
 *          (ms, Redis clock) when admitted, 0 when refused, −ms until the RPM gate opens when the gate refused}.
 *
 * The RPM gate is one token bucket per pool shared by every node: `rpm` per minute, holding at most one
 * second of it (at least one request), refilled from the time of the last take; a slot is taken only with
 * a token. A pause (retry hint, spent window) shuts it for the pause key's remaining life.
 *
 * The line makes nodes take turns: a node may take a slot only when more slots are free than nodes queued
 * ahead of it; a node served goes to the back of the line. Expired leases (a dead node's) and expired line
 * entries (a dead node's waiters) are dropped first, so they cost one term at most.
 *
 * What cannot change within one script (the time, the pruning, the stored limit, the pause, the other
 * budget members' counts) is read once; what the callers change (this pool's count and tokens) is carried
 * from one caller to the next, and this node's place in the line is read again after it wrote the line.
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
local node = ARGV[1]
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[4])
local pause = redis.call('PTTL', KEYS[6])
if pause < 0 then pause = 0 end
local rpm = tonumber(redis.call('HGET', KEYS[5], 'rpm') or '')
local tokens, rate
if rpm and rpm > 0 then
  rate = rpm / 60000
  local cap = math.max(1, rpm / 60)
  tokens = tonumber(redis.call('HGET', KEYS[5], 'tokens') or '')
  local at = tonumber(redis.call('HGET', KEYS[5], 'at') or '')
  if not tokens or not at then tokens = cap else tokens = math.min(cap, tokens + math.max(0, now - at) * rate) end
end
local b = 5 + 4 * n
local bmax = tonumber(ARGV[b] or '-1')
local reserved, others, oborrowed, rsum = 0, 0, 0, 0
if bmax >= 0 then
  reserved = tonumber(ARGV[b + 1])
  rsum = reserved
  for i = 7, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    local c = redis.call('ZCARD', KEYS[i])
    local r = tonumber(ARGV[b + i - 5])
    others = others + c
    oborrowed = oborrowed + math.max(0, c - r)
    rsum = rsum + r
  end
end
local out = {0, limit}
local took = false
local ahead, inline
local lineRead = false
for j = 0, n - 1 do
  local a = 5 + 4 * j
  local mode = tonumber(ARGV[a + 2])
  -- Only this node's own line writes below change its place: read it again after one of those.
  if not lineRead then
    ahead = redis.call('ZRANK', KEYS[3], node)
    inline = ahead ~= false
    if not inline then ahead = redis.call('ZCARD', KEYS[3]) end
    lineRead = true
  end
  local gate = pause
  if tokens and tokens < 1 then gate = math.max(gate, math.ceil((1 - tokens) / rate)) end
  local answer = 0
  if gate > 0 then
    answer = -gate
  else
    local ok = count + ahead < limit
    if ok and bmax >= 0 then
      local borrowed = math.max(0, count - reserved) + oborrowed
      ok = count + others < bmax and (count < reserved or borrowed < math.max(0, bmax - rsum))
    end
    if ok then
      answer = now + tonumber(ARGV[a + 1])
      redis.call('ZADD', KEYS[1], answer, ARGV[a])
      count = count + 1
      if tokens then
        tokens = tokens - 1
        took = true
      end
      if ARGV[a + 3] == '1' then
        redis.call('ZADD', KEYS[3], now, node)
        redis.call('ZADD', KEYS[4], now + ttl, node)
        lineRead = false
      elseif inline then
        redis.call('ZREM', KEYS[3], node)
        redis.call('ZREM', KEYS[4], node)
        lineRead = false
      end
    end
  end
  if answer <= 0 and mode > 0 then
    redis.call('ZADD', KEYS[3], 'NX', now, node)
    redis.call('ZADD', KEYS[4], now + ttl, node)
    lineRead = false
  end
  out[j + 3] = answer
end
if took then redis.call('HSET', KEYS[5], 'tokens', tokens, 'at', now) end
out[1] = count
return out
`,
);

/**
 * Releases a batch of leases of one pool (one node's releases of one event-loop turn); wakes waiting nodes
 * (pub/sub, once) only when a slot was really freed and somebody waits.
 * KEYS: 1 slots, 2 line. ARGV: 1 publish command (PUBLISH; SPUBLISH on a Cluster, whose channel is in the
 * keys' own hash slot), 2 channel, 3 message, 4 always publish (1: budget pools, whose waiters may sit in
 * another pool's line), 5.. lease ids. Returns {pool in-flight after, then 1/0 per lease: it was held}.
 */
export const RELEASE = script(
  'release',
  `
local out = {0}
local removed = 0
for i = 5, #ARGV do
  local r = redis.call('ZREM', KEYS[1], ARGV[i])
  removed = removed + r
  out[i - 3] = r
end
if removed > 0 and (ARGV[4] == '1' or redis.call('EXISTS', KEYS[2]) == 1) then
  if ARGV[1] == 'SPUBLISH' then redis.call('SPUBLISH', ARGV[2], ARGV[3]) else redis.call('PUBLISH', ARGV[2], ARGV[3]) end
end
out[1] = redis.call('ZCARD', KEYS[1])
return out
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

export const SCRIPTS = [ACQUIRE, RELEASE, REFRESH, RENEW, PAUSE, SET_RPM] as const;
