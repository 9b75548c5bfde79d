// The Redis governor (many nodes): slots are leases in a sorted set per pool scored by deadline, decided by
// Lua scripts (EVALSHA); waiters queue FIFO per node and are woken by pub/sub, with a timed retry behind it.
import { randomBytes } from 'node:crypto';
import type { RedisOptions } from 'ioredis';
import { describeTarget, type RedisTarget } from '../config/redis-target.js';
import { connectRedis, endClient, isCluster, type RedisClient } from './redis-connect.js';
import { abortableOf, abortedAlready, waitSignal, type Admission, type LazyAbortSignal, type AdmitRequest, type BudgetLimits, type Governor, type Outcome, type Permit, type PoolLimits, type PoolState, type RefusalReason } from './governor.js';
import { EMPTY_STATE, nextAdaptive, sanitizeLimits } from './pool-limits.js';
import { BudgetShare } from './budget-share.js';
import { MemoryGovernor } from './memory.js';
import { MAX_TIMER_MS, SYSTEM_TIME, timeFrom, type GovernorTime, type GovernorTimers } from './clock.js';
import { WaitQueue, type WaitNode } from './wait-queue.js';
import { ACQUIRE, PAUSE, REFRESH, RELEASE, RENEW, SCRIPTS, SET_RPM, type Script } from './redis-scripts.js';
import { AdaptiveLimit } from './adaptive-limit.js';
import { gateRetryHintMs, learnedState, learnOutcome, nextAvgHold, type LearnedState } from './outcome-learning.js';
import * as rules from './admission-rules.js';
import type { SlotCounts } from './admission-rules.js';
import { RpmLearner } from './rpm-learner.js';
import { TurnBatch } from './turn-batch.js';

/** How long a published RPM gate lives in Redis unless published again (a stopped learner cannot hold it). */
const RPM_TTL_MS = 600_000;
/**
 * Releases this node made in the last this many ms are sent again after a failover: a replica promoted a
 * moment after the release may have missed it (replication is asynchronous), and the lease would hold a slot
 * until its term ran out. ZREM of a lease id is idempotent and ids are never reused.
 */
const REPLAY_MS = 2000;
/** Cluster: how long a group's primary counts as unreachable after a command to it failed (then it is tried again). */
const SLOT_DOWN_MS = 250;
/** Releases kept for a replay at most (a bound on memory, far above what 2 s of a busy node release). */
const REPLAY_MAX = 50_000;
/** Callers in one acquire or release script call at most: a script blocks Redis while it runs. */
const MAX_BATCH = 128;

export type FailurePolicy = 'closed' | 'open';

/** Time and randomness default to the system's; tests pass fake ones. */
export interface RedisGovernorOptions extends Partial<GovernorTime> {
  /** redis://… ; ignored when `target` is given. */
  url?: string;
  /** One server, a Sentinel-watched primary or a Cluster (src/config/redis-target.ts). */
  target?: RedisTarget;
  /** Extra ioredis options (tests: db index). */
  redisOptions?: RedisOptions;
  /** Prefix of every key and of the wake-up channel (no `{`: the hash tag must be the first braces). */
  prefix?: string;
  /** Lease term: a node that dies without releasing loses its slots after this long. */
  termMs?: number;
  /** Fallback retry of a node's waiters when no wake-up arrives (jittered up to 2×). */
  retryMs?: number;
  /** Redis down: 'closed' refuses (unavailable, backendDown); 'open' admits against a local per-node limit. */
  failurePolicy?: FailurePolicy;
  /** With 'open': each node admits up to max(1, floor(maxConcurrent / divisor)) per pool on its own. */
  failOpenDivisor?: number;
  /** Called when the connection drops or comes back (logging). */
  onConnection?: (up: boolean, err?: unknown) => void;
}

/**
 * A slot handed out as a lease (the lock API's: src/lock/redis-leases.ts): it lives on Redis alone; any node
 * may renew or release it.
 */
export interface Lease {
  poolId: number;
  leaseId: string;
  /** Unix ms (Redis clock). */
  deadline: number;
  /** The lease's own key, in the pool's hash tag: what its holder keeps beside it (the lock API's cap). */
  key: string;
}

/** What the lock API's lease registry uses of a pool's keys (its scripts touch these with the slots). */
export interface LeaseKeys {
  readonly slots: string;
  /** Prefix of a lease's own key (+ lease id). */
  readonly lease: string;
}

/** The answer while Redis cannot be reached (fail-closed). */
export function backendDown(): Admission {
  return { ok: false, reason: 'unavailable', queuedMs: 0, retryAfterMs: 1000, backendDown: true };
}

export type LeaseAdmission = { ok: true; lease: Lease; queuedMs: number; queued: boolean } | Extract<Admission, { ok: false }>;

/** Where one pool's keys live: its own tag, or its budget's, so a budget's scripts touch one slot. */
interface PoolKeys {
  tag: string;
  slots: string;
  eff: string;
  line: string;
  lineExp: string;
  /** Prefix of a lock lease's own key (+ lease id). */
  lease: string;
  /** The pool's RPM gate (hash) and pause (a key that lives as long as the pause). */
  rate: string;
  pause: string;
}

/**
 * Where a waiter is. `Trying`: a newcomer whose first attempt is out and who will not wait; `Pending`: one
 * that will wait if refused (counted in its pool's `pending`); `Queued`: in this node's queue (counted as
 * queued in its answer, whatever it is); `Settled`: answered, nothing more happens to it.
 */
const Phase = { Trying: 0, Pending: 1, Queued: 2, Settled: 3 } as const;
type Phase = (typeof Phase)[keyof typeof Phase];

/** What an acquire script call asks for one caller (the script's `mode` argument). */
const Attempt = { FailFast: 0, Newcomer: 1, Queued: 2 } as const;
type Attempt = (typeof Attempt)[keyof typeof Attempt];

class Waiter implements WaitNode<Waiter> {
  prev: Waiter | null = null;
  next: Waiter | null = null;
  linked = false;
  timer: unknown = null;
  phase: Phase = Phase.Trying;
  /** The governor's clock after which it no longer waits (a shut RPM gate that opens later refuses at once). */
  waitUntil = 0;
  /** Its acquire script is on its way to Redis or back: the answer may be a slot. */
  attempting = false;
  /** Its wait ended (timeout, abort) during an attempt: settled once that attempt's answer is in. */
  ended: RefusalReason | null = null;
  constructor(
    readonly view: PoolView,
    readonly seq: number,
    readonly signal: AbortSignal | undefined,
    readonly enqueuedAt: number,
    readonly termMs: number,
    readonly keepAlive: boolean,
    readonly resolve: (a: Admission | LeaseAdmission) => void,
    /** The lease's member in the slots set: the caller's (lock API slot id) or node id + sequence. */
    readonly leaseId: string,
  ) {}

  handleEvent(): void {
    this.view.gov.giveUp(this, 'aborted');
  }
}

function onWaitTimeout(w: Waiter): void {
  w.view.gov.giveUp(w, 'queue_timeout');
}

/** A slot held by this node; its lease is kept alive by the node's refresh until released. */
export class RedisPermit implements Permit {
  #released = false;
  constructor(
    readonly gov: RedisGovernor,
    readonly poolId: number,
    readonly keys: PoolKeys,
    readonly leaseId: string,
    readonly grantedAt: number,
  ) {}

  release(outcome?: Outcome): void {
    if (this.#released) return;
    this.#released = true;
    this.gov.releasePermit(this, outcome);
  }
}

/**
 * A slot the fail-open fallback granted while Redis (or the pool's Cluster primary) was away. It is written
 * to Redis as a lease once Redis answers again (with the write-back of live leases), so that the admissions
 * after the failover count it; its release then removes that lease too.
 */
class FallbackPermit implements Permit {
  #released = false;
  /** Its lease is in Redis (written back): the release must remove it. */
  written = false;
  constructor(
    readonly gov: RedisGovernor,
    readonly inner: Permit,
    readonly keys: PoolKeys,
    readonly leaseId: string,
  ) {}

  get poolId(): number {
    return this.inner.poolId;
  }

  release(outcome?: Outcome): void {
    if (this.#released) return;
    this.#released = true;
    this.inner.release(outcome);
    this.gov.releaseFallback(this);
  }
}

/**
 * A caller's abort signal for the fail-open fallback's queue, with one more reason to leave it: Redis answers
 * again, and the caller is admitted through Redis instead (`moved`).
 */
class FallbackWait implements LazyAbortSignal {
  moved = false;
  #ctl: AbortController | null = null;
  constructor(readonly caller: LazyAbortSignal | undefined) {}

  get aborted(): boolean {
    return this.moved || (this.caller?.aborted ?? false);
  }

  signal(): AbortSignal {
    this.#ctl ??= new AbortController();
    const s = this.caller?.signal();
    return s === undefined ? this.#ctl.signal : AbortSignal.any([s, this.#ctl.signal]);
  }

  move(): void {
    this.moved = true;
    this.#ctl?.abort();
  }
}

/**
 * This node's view of one pool: its limits, last known pool-wide count, and its local FIFO. The scripts
 * decide and count; the rest of the admission rules (the queue's refusals, the retry hint, what remains)
 * read this view as their slot counts.
 */
class PoolView implements SlotCounts {
  limits: PoolLimits;
  keys: PoolKeys;
  group: Group | null = null;
  active = true;
  /** Pool-wide in-flight as last seen in a script reply, adjusted by this node's own releases. */
  count = 0;
  /** Effective limit from Redis (min of max and the stored adaptive value), as last seen. */
  stored: number | null = null;
  readonly queue = new WaitQueue<Waiter>();
  /** Callers waiting in the fail-open fallback's queue: moved to Redis once it answers (#moveFallbackWaits). */
  readonly fallbackWaits = new Set<FallbackWait>();
  /** Newcomers whose first attempt is in flight and who will wait if it fails. */
  pending = 0;
  /**
   * This node's releases sent but not yet answered. Replies come back in order on one connection, so a
   * reply's count already reflects every earlier release and none of these: count = reply − unacked.
   */
  unacked = 0;
  avgHoldMs = 0;
  /** This node's adaptive controller (learns from this node's releases); null while adaptive is off. */
  adaptive: AdaptiveLimit | null = null;
  /** Learns the upstream's rate and pauses from this node's releases; the gate itself is in Redis. */
  readonly rpm = new RpmLearner();
  /** What this node last published: the adaptive limit, the gate rpm (and when), the pause end. */
  publishedLimit: number | null = null;
  publishedRpm = NaN;
  publishedRpmAt = 0;
  publishedPause = -Infinity;
  /** The governor's clock until which the last script reply said the RPM gate is shut. */
  gateUntil = 0;

  constructor(readonly gov: RedisGovernor, limits: PoolLimits, keys: PoolKeys) {
    this.limits = limits;
    this.keys = keys;
    this.learnFrom(limits, gov.now());
  }

  /** Applies the adaptive and RPM settings, as the memory governor does for its pools. */
  learnFrom(limits: PoolLimits, now: number): void {
    this.adaptive = nextAdaptive(this.adaptive, limits);
    this.rpm.setOverride(limits.rpmOverride ?? null, now);
  }

  get inFlight(): number {
    return this.count;
  }

  get reservedConcurrent(): number {
    return this.limits.reservedConcurrent;
  }

  get waiting(): number {
    return this.queue.size + this.pending;
  }

  /** Waiting here counts newcomers whose first answer is on its way. */
  get queued(): number {
    return this.queue.size + this.pending;
  }

  get queueLength(): number {
    return this.limits.queueLength;
  }

  get queueTimeoutMs(): number {
    return this.limits.queueTimeoutMs;
  }

  /** The budget is counted in Redis; state() builds a share from the last counts when it needs one. */
  get budget(): null {
    return null;
  }

  /** The gate is in Redis: shut until the time the last script reply said. */
  rpmAllows(now: number): boolean {
    return !(this.gateUntil > now);
  }

  rpmWaitMs(now: number): number {
    return this.gateUntil > now ? this.gateUntil - now : 0;
  }

  effectiveLimit(): number {
    if (!this.active) return 0;
    return this.stored === null ? this.limits.maxConcurrent : Math.min(this.limits.maxConcurrent, this.stored);
  }

  retryAfterMs(): number {
    return rules.retryAfterMs(this);
  }
}

/** Pools that share one hash tag: one standalone pool, or the pools of one capped budget. */
class Group {
  readonly members: PoolView[] = [];
  pumping = false;
  dirty = false;
  timer: unknown = null;
  /**
   * Cluster: until this time (the governor's clock) the group's primary is taken as unreachable, as the whole
   * server is while disconnected: callers get the failure policy at once instead of each waiting for a
   * command to fail first.
   */
  downUntil = 0;
  constructor(readonly tag: string, readonly budgetMax: number | null) {}
}



/** One caller in a pool's acquire batch; `settle` gets its answer (ACQUIRE: deadline, 0, or −gate ms). */
interface AcquireCall {
  w: Waiter;
  mode: Attempt;
  more: boolean;
  settle: (answer: number) => void;
  fail: (err: unknown) => void;
}

/** One lease in a release batch; `done`/`fail` only for a caller that wants the answer (the lock API). */
interface ReleaseCall {
  leaseId: string;
  /** The pool whose count this release lowers (the keys are still its own). */
  v: PoolView | undefined;
  done: ((held: boolean) => void) | null;
  fail: ((err: unknown) => void) | null;
}

/**
 * Admission shared by every node through Redis. The acquires this node makes for one pool in one event-loop
 * turn go as one script call, and so do its releases (releases first): one round trip decides every caller
 * in it, in arrival order. Waiters are FIFO per node; nodes take turns through a line in Redis, so a busy
 * node cannot starve another.
 */
export class RedisGovernor implements Governor {
  readonly nodeId = randomBytes(8).toString('hex');
  readonly redis: RedisClient;
  /** A Cluster: wake-ups go by sharded pub/sub on a channel per hash tag (in the tag's own slot). */
  readonly #cluster: boolean;
  /** The tags whose wake-up channel the subscriber has asked for (Cluster). */
  readonly #subscribed = new Set<string>();
  /** Scripts loaded with SCRIPTS on connect (useScripts). */
  readonly #extraScripts: Script[] = [];
  readonly #sub: RedisClient;
  readonly #prefix: string;
  readonly #channel: string;
  readonly #termMs: number;
  readonly #retryMs: number;
  readonly #lineTtlMs: number;
  readonly #policy: FailurePolicy;
  readonly #divisor: number;
  readonly #fallback: MemoryGovernor | null;
  readonly #onConnection: (up: boolean, err?: unknown) => void;
  /** Monotonic ms (the injected clock). */
  readonly now: () => number;
  readonly #wallClock: () => number;
  readonly #timers: GovernorTimers;
  readonly #random: () => number;
  readonly #views = new Map<number, PoolView>();
  readonly #groups = new Map<string, Group>();
  /** Leases this node keeps alive, by slots key. */
  readonly #held = new Map<string, Set<RedisPermit>>();
  /** The fail-open fallback's slots in use, by slots key: written to Redis as leases once it answers. */
  readonly #fallbackHeld = new Map<string, Set<FallbackPermit>>();
  /** Releases that could not reach Redis; sent again once it is back. */
  readonly #unsent = new Map<string, { keys: PoolKeys; leaseId: string }>();
  /** Releases Redis acknowledged, oldest first, for the replay after a failover (REPLAY_MS). */
  #recent: { keys: PoolKeys; leaseId: string; at: number }[] = [];
  /** Set when Redis (one Cluster primary, or the server) went away: releases acknowledged since this are replayed. */
  #replayFrom: number | null = null;
  /** A retry of unsent releases and the replay, while some are pending (a Cluster has no reconnect to trigger it). */
  #resendTimer: NodeJS.Timeout | null = null;
  /** Slots keys whose REFRESH (lease refresh and fallback write-back) is on its way: one at a time per key. */
  readonly #writing = new Map<string, Promise<boolean>>();
  /**
   * Slots keys whose leases this node holds since before Redis (or the key's Cluster primary) went away, by
   * a mark that changes at each loss: the primary answering now may be a replica that missed them, so they are
   * written again (REFRESH) before this node admits there. Cleared by a REFRESH sent after the last mark.
   */
  readonly #rewrite = new Map<string, number>();
  #lossMark = 0;
  readonly #refreshTimer: NodeJS.Timeout;
  /** This turn's acquires by pool and releases by pool keys; sent at the end of the turn (#sendTurn). */
  readonly #acquires = new TurnBatch<PoolView, AcquireCall>((v, calls) => this.#sendAcquires(v, calls), MAX_BATCH);
  readonly #releases = new TurnBatch<PoolKeys, ReleaseCall>((keys, calls) => this.#sendReleases(keys, calls), MAX_BATCH);
  #turnScheduled = false;
  #seq = 0;
  #closed = false;
  #up = false;
  readonly #ready: Promise<void>;
  #markReady: () => void = () => {};

  constructor(opts: RedisGovernorOptions = {}) {
    const time = timeFrom(opts, SYSTEM_TIME);
    this.now = time.now;
    this.#wallClock = time.wallClock;
    this.#timers = time.timers;
    this.#random = time.random;
    this.#prefix = opts.prefix ?? 'poolgate:';
    if (this.#prefix.includes('{')) throw new Error('the governor key prefix must not contain "{"');
    this.#channel = `${this.#prefix}freed`;
    this.#termMs = opts.termMs ?? 30_000;
    this.#retryMs = opts.retryMs ?? 50;
    this.#lineTtlMs = Math.max(500, this.#retryMs * 10);
    this.#policy = opts.failurePolicy ?? 'closed';
    this.#divisor = Math.max(1, Math.floor(opts.failOpenDivisor ?? 1));
    this.#fallback = this.#policy === 'open' ? new MemoryGovernor(time) : null;
    const onConnection = opts.onConnection ?? (() => {});
    // Once close() has begun, the connection's end is ours, not news (it was logged after "shutdown complete").
    this.#onConnection = (up, err) => void (this.#closed || onConnection(up, err));
    const base: RedisOptions = {
      enableAutoPipelining: true,
      // Acquires and releases are already one call per pool per turn (TurnBatch): written at once, they skip
      // a second turn of waiting and ioredis's pipeline bookkeeping. Leaving the line (ZREM) is written at
      // once too, so it reaches Redis before any acquire this node sends after it.
      autoPipeliningIgnoredCommands: ['evalsha', 'zrem'],
      // Down means down: a command fails at once rather than waiting in a queue behind a dead connection,
      // and a command in flight when the connection drops is failed, not silently sent again.
      enableOfflineQueue: false,
      autoResendUnfulfilledCommands: false,
      maxRetriesPerRequest: 0,
      retryStrategy: (n: number) => Math.min(50 * n, 1000),
      ...opts.redisOptions,
    };
    const target: RedisTarget = opts.target ?? { kind: 'single', url: opts.url ?? 'redis://127.0.0.1:6379' };
    // On a Cluster, a command for a primary that is gone fails at once too (ioredis would retry it for up to
    // 16 × 100 ms): the policy answers, and the slot map is read again every second until a replica took over.
    this.redis = connectRedis(target, base, { retryDelayOnFailover: 0, retryDelayOnClusterDown: 0 });
    this.#cluster = isCluster(this.redis);
    // The subscriber waits for its connection (its subscriptions are made once and followed across reconnects
    // and failovers by ioredis); on a Cluster it keeps one sharded subscriber per primary.
    const subOptions: RedisOptions = { ...base, enableOfflineQueue: true, maxRetriesPerRequest: null, enableAutoPipelining: false };
    this.#sub = connectRedis(target, subOptions, { shardedSubscribers: true });
    this.#sub.on(this.#cluster ? 'smessage' : 'message', (_channel: string, tag: string) => this.#wake(tag));
    this.#sub.on('error', () => {});
    this.#ready = new Promise<void>((resolve) => {
      this.#markReady = resolve;
    });
    this.redis.on('ready', () => this.#connected());
    this.redis.on('close', () => this.#disconnected());
    this.redis.on('error', (err: unknown) => this.#onConnection(false, err));
    // ioredis gives up a connection only on our say-so (retryStrategy always answers); should it end anyway,
    // it is opened again: a node must not stay on its failure policy for good.
    this.redis.on('end', () => {
      if (this.#closed) return;
      setTimeout(() => {
        if (!this.#closed && this.redis.status === 'end') this.redis.connect().catch(() => {});
      }, 1000).unref();
    });
    if (!this.#cluster) void this.#sub.subscribe(this.#channel).catch(() => {});
    // Cluster: a node gone from the slot map (a primary lost, its replica promoted) is a loss even for a node that
    // had no command fail meanwhile: the new primary may lack leases this node holds (#lost, #writeBack).
    else this.redis.on('-node', () => this.#lost());
    this.#refreshTimer = setInterval(() => this.#refreshAll(), Math.max(10, Math.floor(this.#termMs / 3)));
    this.#refreshTimer.unref();
  }

  /** Resolves once connected the first time (or rejects after timeoutMs). */
  ready(timeoutMs = 5000): Promise<void> {
    let timer: NodeJS.Timeout;
    return Promise.race([
      this.#ready,
      new Promise<void>((_, reject) => {
        timer = setTimeout(() => reject(new Error('redis governor: no connection')), timeoutMs);
      }),
    ]).finally(() => clearTimeout(timer));
  }

  get connected(): boolean {
    return this.#up && this.redis.status === 'ready';
  }

  #keys(l: PoolLimits, budgetCapped: boolean): PoolKeys {
    const tag = budgetCapped && l.budgetId !== null ? `{b:${l.budgetId}}` : `{p:${l.poolId}}`;
    const k = `${this.#prefix}${tag}:${l.poolId}:`;
    return { tag, slots: `${k}slots`, eff: `${k}eff`, line: `${k}line`, lineExp: `${k}line-exp`, lease: `${k}lease:`, rate: `${k}rate`, pause: `${k}pause` };
  }

  configure(pools: readonly PoolLimits[], budgets: readonly BudgetLimits[]): void {
    // Calls collected under the old limits and keys go out as they were made.
    this.#sendTurn();
    const caps = new Map<number, number>();
    for (const b of budgets) if (b.originMaxConcurrent !== null) caps.set(b.budgetId, Math.max(0, Math.floor(b.originMaxConcurrent)));
    const seen = new Set<number>();
    for (const raw of pools) {
      const limits = sanitizeLimits(raw);
      seen.add(limits.poolId);
      const keys = this.#keys(limits, limits.budgetId !== null && caps.has(limits.budgetId));
      const v = this.#views.get(limits.poolId);
      if (v) {
        v.limits = limits;
        v.learnFrom(limits, this.now());
        v.active = true;
        if (v.keys.slots !== keys.slots) {
          // The pool joined or left a budget: its count lives under another tag from now on.
          v.keys = keys;
          v.count = 0;
        }
      } else {
        this.#views.set(limits.poolId, new PoolView(this, limits, keys));
      }
    }
    for (const [id, v] of this.#views) {
      if (seen.has(id)) continue;
      v.active = false;
      this.#refuseAll(v, 'unavailable');
      this.#views.delete(id);
    }
    for (const g of this.#groups.values()) if (g.timer !== null) this.#timers.clearTimeout(g.timer);
    this.#groups.clear();
    for (const v of this.#views.values()) {
      const cap = v.limits.budgetId === null ? undefined : caps.get(v.limits.budgetId);
      let g = this.#groups.get(v.keys.tag);
      if (!g) {
        g = new Group(v.keys.tag, cap ?? null);
        this.#groups.set(v.keys.tag, g);
      }
      g.members.push(v);
      v.group = g;
    }
    this.#fallback?.configure(
      pools.map((p) => ({ ...p, maxConcurrent: Math.max(1, Math.floor(p.maxConcurrent / this.#divisor)) })),
      budgets.map((b) => ({ ...b, originMaxConcurrent: b.originMaxConcurrent === null ? null : Math.max(1, Math.floor(b.originMaxConcurrent / this.#divisor)) })),
    );
    this.#subscribeTags();
    for (const v of this.#views.values()) this.#publish(v);
    // Raised limits admit waiters at once.
    for (const g of this.#groups.values()) this.#pump(g);
  }

  /**
   * Feeds one upstream answer to this node's RPM learner and adaptive controller, exactly as the memory
   * governor reads it (a lock release's `rate` wins over headers; a retry hint counts only on a refusal;
   * a 429 the rate headers explain is a rate signal, not a concurrency one), then shares the result.
   * `inFlight` is the pool-wide count with this slot still in it.
   */
  #learn(v: PoolView, o: Outcome, held: number, inFlight: number): void {
    learnOutcome(o, held, this.now(), this.#wallClock(), v.rpm, v.adaptive, Math.max(1, inFlight));
    this.#publish(v);
  }

  /**
   * Shares what this node's learners concluded with every node: its adaptive limit (setEffectiveLimit), the
   * RPM gate rate (SET_RPM: the bucket itself lives in Redis) and a pause (PAUSE). Each is sent only when
   * it changed, or again before its TTL runs out; the last node to learn something wins.
   */
  #publish(v: PoolView): void {
    if (this.#closed || !this.connected) return;
    const now = this.now();
    const stale = now - v.publishedRpmAt > RPM_TTL_MS / 2;
    const limit = v.adaptive === null ? null : v.adaptive.limit;
    if (limit !== v.publishedLimit || (limit !== null && stale)) {
      v.publishedLimit = limit;
      this.setEffectiveLimit(v.limits.poolId, limit, RPM_TTL_MS).catch(() => {
        v.publishedLimit = null;
      });
    }
    const rpm = v.rpm.gateRpm;
    const same = rpm === v.publishedRpm || (Number.isNaN(rpm) && Number.isNaN(v.publishedRpm));
    if (!same || (rpm > 0 && stale)) {
      v.publishedRpm = rpm;
      this.#eval(SET_RPM, [v.keys.rate], [rpm > 0 ? String(rpm) : '', String(RPM_TTL_MS)]).catch(() => {
        v.publishedRpm = NaN;
      });
    }
    if (stale) v.publishedRpmAt = now;
    const until = v.rpm.pausedUntil;
    if (until > now && until > v.publishedPause) {
      v.publishedPause = until;
      if (until > v.gateUntil) v.gateUntil = until;
      this.#eval(PAUSE, [v.keys.pause], [String(Math.ceil(until - now))]).catch(() => {
        v.publishedPause = -Infinity;
      });
    }
  }

  /**
   * Stores the effective limit of a pool in Redis for every node (the adaptive controller's output):
   * admissions use min(maxConcurrent, n). null removes it. It expires after ttlMs unless set again, so a
   * stopped controller cannot pin a pool low forever.
   */
  async setEffectiveLimit(poolId: number, n: number | null, ttlMs = 600_000): Promise<void> {
    const v = this.#views.get(poolId);
    if (!v) return;
    if (n === null) {
      await this.redis.del(v.keys.eff);
      v.stored = null;
    } else {
      const limit = Math.max(0, Math.floor(n));
      await this.redis.set(v.keys.eff, String(limit), 'PX', Math.max(1, Math.floor(ttlMs)));
      v.stored = limit;
    }
    if (v.group) this.#pump(v.group);
  }

  acquire(req: AdmitRequest): Admission | Promise<Admission> {
    return this.#acquire(req, this.#termMs, true, null) as Admission | Promise<Admission>;
  }

  /**
   * A slot as a lease that this node does not keep alive (the lock API's acquire: src/lock/redis-leases.ts).
   * It lives until `termMs` after the grant unless renewed (renewLease) or released (releaseLease), from this
   * node or any other. `leaseId` lets the caller name the lease (an unguessable slot id); it must be unique
   * within the pool.
   */
  async acquireLease(req: AdmitRequest & { termMs: number; leaseId?: string }): Promise<LeaseAdmission> {
    return this.#acquire(req, Math.max(1, Math.floor(req.termMs)), false, req.leaseId ?? null) as LeaseAdmission | Promise<LeaseAdmission>;
  }

  /** Moves a lease's deadline (Unix ms). False when the lease is gone (released or reclaimed). */
  async renewLease(poolId: number, leaseId: string, deadline: number): Promise<boolean> {
    const v = this.#views.get(poolId);
    if (!v) return false;
    return (await this.#eval(RENEW, [v.keys.slots], [leaseId, String(Math.floor(deadline))])) === 1;
  }

  /** Frees a lease from any node. True when it was held, false when it was already gone. */
  releaseLease(poolId: number, leaseId: string): Promise<boolean> {
    const v = this.#views.get(poolId);
    if (!v) return Promise.resolve(false);
    return new Promise<boolean>((done, fail) => {
      v.unacked++;
      this.#releases.add(v.keys, { leaseId, v, done, fail });
      this.#scheduleTurn();
    });
  }

  /** Sends a lease's release without waiting for the answer (again once Redis is back, if it is down). */
  dropLease(poolId: number, leaseId: string): void {
    const v = this.#views.get(poolId);
    if (v) this.#sendRelease(v.keys, leaseId);
  }

  /** The keys of a pool the lease registry's own scripts use; null for a pool this node does not know. */
  leaseKeys(poolId: number): LeaseKeys | null {
    return this.#views.get(poolId)?.keys ?? null;
  }

  /**
   * Scripts of the lease registry, loaded with the governor's own on every (re)connect (and now, when
   * connected), so that their first call after a Redis restart is not a load and a second round trip.
   */
  useScripts(scripts: readonly Script[]): void {
    for (const sc of scripts) {
      if (this.#extraScripts.includes(sc)) continue;
      this.#extraScripts.push(sc);
      if (this.connected) this.#loadScripts([sc]).catch(() => {});
    }
  }

  /** Runs a script by hash (loading it when Redis does not know it). Rejects while Redis is unreachable. */
  runScript(s: Script, keys: string[], args: string[]): Promise<unknown> {
    return this.#eval(s, keys, args);
  }

  /**
   * Feeds the outcome of a lease released from any node to this node's RPM learner and adaptive limit (which
   * share what they learn through Redis), like a local release.
   */
  learnLease(poolId: number, outcome: Outcome): void {
    const v = this.#views.get(poolId);
    if (!v || this.#closed) return;
    this.#learn(v, outcome, NaN, v.count);
  }

  #down(): Admission {
    return backendDown();
  }

  /** Whether admissions of `v` go through Redis now: connected, and (Cluster) its primary not taken as down. */
  #redisAnswers(v: PoolView): boolean {
    return this.connected && !(v.group !== null && v.group.downUntil > this.now());
  }

  #acquire(req: AdmitRequest, termMs: number, keepAlive: boolean, leaseId: string | null, writtenBack = false): Admission | LeaseAdmission | Promise<Admission | LeaseAdmission> {
    const v = this.#views.get(req.poolId);
    if (v === undefined || !v.active || this.#closed) return { ok: false, reason: 'unavailable', queuedMs: 0 };
    if (abortedAlready(req)) return { ok: false, reason: 'aborted', queuedMs: 0 };
    if (!this.#redisAnswers(v)) {
      if (this.#fallback && keepAlive) return this.#viaFallback(v, req, this.now());
      return this.#down();
    }
    // Redis answers again: what this node holds in the group is written there first (one round trip), so that
    // the script counts it. (Once; a write that failed leaves the failure policy to the next check.)
    if (!writtenBack) {
      const wb = this.#writeBack(v);
      if (wb !== null) return wb.then(() => this.#acquire(req, termMs, keepAlive, leaseId, true));
    }
    const waitMs = Math.min(req.waitMs, v.queueTimeoutMs);
    const mayWait = rules.mayQueue(v, waitMs);
    // A newcomer never overtakes a waiter of its own pool on this node; else the script decides.
    if (!mayWait && (v.queue.size > 0 || (v.group?.pumping && v.waiting > 0))) return rules.queueRefusal(v, waitMs)!;
    const signal = waitSignal(req);
    return new Promise((resolve) => {
      const seq = ++this.#seq;
      const w = new Waiter(v, seq, signal, this.now(), termMs, keepAlive, resolve, leaseId ?? `${this.nodeId}:${seq}`);
      w.waitUntil = w.enqueuedAt + (mayWait ? waitMs : 0);
      if (mayWait) signal?.addEventListener('abort', w);
      if (v.queue.size > 0) {
        this.#enqueue(w, waitMs);
        return;
      }
      if (mayWait) {
        w.phase = Phase.Pending;
        v.pending++;
      }
      this.#attempt(w, mayWait ? Attempt.Newcomer : Attempt.FailFast).then(
        (admitted) => {
          this.#unpend(w);
          if (admitted || w.phase === Phase.Settled) return;
          if (!mayWait) {
            this.#settle(w, rules.refuse(v, waitMs > 0 ? 'queue_full' : 'no_slot'));
            return;
          }
          this.#enqueue(w, waitMs);
        },
        () => this.#unpend(w),
      );
    });
  }

  /**
   * Queues a waiter. Its wait is measured from arrival, but a newcomer's first attempt always gets its answer:
   * the round trip that decides is not waiting for a slot.
   */
  #enqueue(w: Waiter, waitMs: number): void {
    const v = w.view;
    if (!v.active || this.#closed) {
      this.#settle(w, { ok: false, reason: 'unavailable', queuedMs: this.now() - w.enqueuedAt });
      return;
    }
    const left = waitMs - (this.now() - w.enqueuedAt);
    if (left <= 0) {
      this.giveUp(w, 'queue_timeout');
      return;
    }
    w.timer = this.#timers.setTimeout(onWaitTimeout, Math.min(left, MAX_TIMER_MS), w);
    w.phase = Phase.Queued;
    v.queue.push(w);
    if (v.group) {
      // A wake-up that found nobody queued while this caller's first attempt was out: try at once.
      if (v.group.dirty && !v.group.pumping) this.#pump(v.group);
      else this.#schedule(v.group);
    }
  }

  /**
   * Runs the acquire script for a waiter. True when it was admitted (or the answer is settled some other
   * way); false when the slot was refused and the waiter still waits. A grant that arrives for a waiter
   * that already gave up is released at once.
   */
  async #attempt(w: Waiter, mode: Attempt): Promise<boolean> {
    const v = w.view;
    const keys = v.keys;
    const leaseId = w.leaseId;
    let answer: number;
    w.attempting = true;
    try {
      answer = await new Promise<number>((settle, fail) => {
        this.#acquires.add(v, { w, mode, more: mode === Attempt.Queued && v.queue.size > 1, settle, fail });
        this.#scheduleTurn();
      });
    } catch {
      w.attempting = false;
      // The answer is unknown: the lease may exist. Release it once Redis is back; refuse or fall back.
      this.#unsent.set(leaseId, { keys, leaseId });
      this.#lost(keys.tag);
      // The group is down first, so that the fallback's answer for this waiter stays local (#viaFallback).
      if (this.#cluster && v.group !== null) this.#slotDown(v.group);
      this.#failWaiter(w);
      return true;
    }
    w.attempting = false;
    const ok = answer > 0;
    const deadline = answer;
    const gate = answer < 0 ? -answer : 0;
    // The wait ended while this attempt was out (giveUp deferred it). Refused: the refusal stands now. Granted
    // after a timeout: the slot is the caller's (the deciding round trip was already on its way). Granted
    // after an abort: the slot goes straight back.
    const ended = w.ended;
    if (ended !== null && w.phase !== Phase.Settled) {
      w.ended = null;
      if (!ok || ended !== 'queue_timeout') {
        if (ok) {
          // Counted as this node's release, like a permit's: the reply's count already includes the lease.
          const current = v.keys === keys ? v : undefined;
          if (current && current.count > 0) current.count--;
          this.#sendRelease(keys, leaseId, current);
        }
        this.giveUp(w, ended);
        return true;
      }
    }
    if (!ok) {
      if (!(gate > 0)) return false;
      const at = this.now();
      v.gateUntil = at + gate;
      // The RPM gate is shut on every node: wait for it only when it opens within this waiter's wait.
      if (at + gate <= w.waitUntil) return false;
      this.#settle(w, { ok: false, reason: 'rate_limited', queuedMs: at - w.enqueuedAt, retryAfterMs: gateRetryHintMs(gate) });
      if (v.queue.size === 0 && v.pending === 0) this.#leaveLine(v);
      return true;
    }
    if (w.phase === Phase.Settled || this.#closed) {
      this.#sendRelease(keys, leaseId);
      return true;
    }
    if (w.linked) v.queue.remove(w);
    const queuedMs = this.now() - w.enqueuedAt;
    if (w.keepAlive) {
      const permit = new RedisPermit(this, v.limits.poolId, keys, leaseId, this.now());
      let set = this.#held.get(keys.slots);
      if (!set) this.#held.set(keys.slots, (set = new Set()));
      set.add(permit);
      this.#settle(w, { ok: true, permit, queuedMs: w.phase === Phase.Queued ? queuedMs : 0, queued: w.phase === Phase.Queued });
    } else {
      this.#settle(w, { ok: true, lease: { poolId: v.limits.poolId, leaseId, deadline, key: keys.lease + leaseId }, queuedMs: w.phase === Phase.Queued ? queuedMs : 0, queued: w.phase === Phase.Queued });
    }
    return true;
  }

  #unpend(w: Waiter): void {
    if (w.phase !== Phase.Pending) return;
    w.phase = Phase.Trying;
    w.view.pending--;
  }

  #settle(w: Waiter, a: Admission | LeaseAdmission): void {
    if (w.phase === Phase.Settled) return;
    this.#unpend(w);
    const queued = w.phase === Phase.Queued;
    w.phase = Phase.Settled;
    if (w.timer !== null) this.#timers.clearTimeout(w.timer);
    w.timer = null;
    w.signal?.removeEventListener('abort', w);
    if (w.linked) w.view.queue.remove(w);
    // Whatever the answer (a slot, a refusal, the fail-open fallback's), a caller that sat in the queue waited.
    if (queued) a.queued = true;
    w.resolve(a);
  }

  /** A waiter's wait ended (timeout or abort) before it got a slot. */
  giveUp(w: Waiter, reason: RefusalReason): void {
    if (w.phase === Phase.Settled) return;
    // An attempt is out: its script may grant a slot in Redis after we answered "no", and that ghost lease
    // would refuse the next caller while nobody shows as waiting or in flight here. The waiter stays queued
    // until the answer is in (one round trip) and #attempt settles it.
    if (w.attempting) {
      w.ended ??= reason;
      return;
    }
    const v = w.view;
    const queuedMs = this.now() - w.enqueuedAt;
    this.#settle(w, reason === 'queue_timeout' ? { ok: false, reason, queuedMs, retryAfterMs: v.retryAfterMs() } : { ok: false, reason, queuedMs });
    if (v.queue.size === 0 && v.pending === 0) this.#leaveLine(v);
  }

  #failWaiter(w: Waiter): void {
    if (w.phase === Phase.Settled) return;
    if (this.#fallback && w.keepAlive) {
      const wait = Math.max(0, w.waitUntil - this.now());
      // The fallback's wait (and a move back to Redis) runs the rest of the caller's wait from here: a timeout of its
      // own would answer the caller while a slot for it may still come, and that slot would be held by nobody.
      if (w.timer !== null) this.#timers.clearTimeout(w.timer);
      w.timer = null;
      const settle = (a: Admission) => {
        // Answered meanwhile (aborted): a slot that comes anyway goes back at once.
        if (w.phase === Phase.Settled) {
          if (a.ok) a.permit.release();
          return;
        }
        this.#settle(w, a);
      };
      const r = this.#viaFallback(w.view, { poolId: w.view.limits.poolId, waitMs: wait, abortable: w.signal && abortableOf(w.signal) }, this.now(), true);
      if (r instanceof Promise) void r.then(settle);
      else settle(r);
      return;
    }
    this.#settle(w, this.#down());
  }

  /**
   * The fail-open fallback's admission of a caller of `v` (asked at `startedAt`) while Redis, or the pool's
   * primary, does not answer. Its grants are written back to Redis as leases once it answers (FallbackPermit).
   * The fallback grants without asking Redis, so it grants nothing once Redis answers again: a caller still in
   * its queue then is moved to Redis (#moveFallbackWaits), and a slot it frees for a caller after that is given
   * back, the caller admitted through Redis. Before, a node whose fallback queue was long when Redis came back
   * kept granting local slots for seconds, each a lease in Redis only after another node had taken the slot
   * its predecessor freed there: the origin saw 11 of 8 well after recovery (issue 27's soak run).
   * `failed`: Redis just failed this caller (a command, not the connection, may have failed): a slot granted
   * at once is kept, not sent back to the Redis that failed it.
   */
  #viaFallback(v: PoolView, req: AdmitRequest, startedAt: number, failed = false): Admission | Promise<Admission> {
    const wait = new FallbackWait(req.abortable);
    const done = (a: Admission, waited: boolean): Admission | Promise<Admission> => {
      if (a.ok && (!this.#redisAnswers(v) || (failed && !waited))) {
        const p = new FallbackPermit(this, a.permit, v.keys, `${this.nodeId}:f${++this.#seq}`);
        let set = this.#fallbackHeld.get(v.keys.slots);
        if (!set) this.#fallbackHeld.set(v.keys.slots, (set = new Set()));
        set.add(p);
        if (this.#cluster) this.#scheduleResend();
        return { ...a, permit: p };
      }
      if (a.ok) a.permit.release();
      else if (!wait.moved || a.reason !== 'aborted' || (req.abortable?.aborted ?? false)) return a;
      // Redis answers: the caller is admitted there, within what is left of its wait.
      const spent = this.now() - startedAt;
      const left = Math.min(req.waitMs, v.queueTimeoutMs) - spent;
      // Moved as its wait ran out: it timed out (a fail-fast try would answer no_slot, 429, to a caller that waited).
      if (waited && left <= 0) return { ok: false, reason: 'queue_timeout', queuedMs: spent, retryAfterMs: v.retryAfterMs(), queued: true };
      const r = this.#acquire({ ...req, waitMs: Math.max(0, left) }, this.#termMs, true, null) as Admission | Promise<Admission>;
      const mark = (b: Admission): Admission => (b.ok ? { ...b, queuedMs: b.queuedMs + spent, queued: b.queued || waited } : { ...b, queuedMs: b.queuedMs + spent, ...(waited ? { queued: true } : {}) });
      return r instanceof Promise ? r.then(mark) : mark(r);
    };
    const r = this.#fallback!.acquire({ poolId: req.poolId, waitMs: req.waitMs, abortable: wait });
    if (!(r instanceof Promise)) return done(r, false);
    v.fallbackWaits.add(wait);
    return r.then((a) => {
      v.fallbackWaits.delete(wait);
      return done(a, true);
    });
  }

  /** Callers waiting in the fallback's queue of a pool whose Redis answers again go through Redis from now. */
  #moveFallbackWaits(): void {
    for (const v of this.#views.values()) {
      if (v.fallbackWaits.size === 0 || !this.#redisAnswers(v)) continue;
      const waits = [...v.fallbackWaits];
      v.fallbackWaits.clear();
      for (const w of waits) w.move();
    }
  }

  releaseFallback(p: FallbackPermit): void {
    const set = this.#fallbackHeld.get(p.keys.slots);
    set?.delete(p);
    if (set?.size === 0) this.#fallbackHeld.delete(p.keys.slots);
    if (p.written && !this.#closed) this.#sendRelease(p.keys, p.leaseId);
  }

  #leaveLine(v: PoolView): void {
    if (!this.connected) return;
    this.redis.zrem(v.keys.line, this.nodeId).catch(() => {});
    this.redis.zrem(v.keys.lineExp, this.nodeId).catch(() => {});
  }

  #refuseAll(v: PoolView, reason: RefusalReason): void {
    for (let w = v.queue.peek(); w !== null; w = v.queue.peek()) {
      if (reason === 'unavailable') this.#settle(w, { ok: false, reason, queuedMs: this.now() - w.enqueuedAt });
      else this.giveUp(w, reason);
    }
  }

  releasePermit(p: RedisPermit, outcome?: Outcome): void {
    const set = this.#held.get(p.keys.slots);
    set?.delete(p);
    if (set?.size === 0) {
      this.#held.delete(p.keys.slots);
      // Nothing of this node's left there to write again.
      this.#rewrite.delete(p.keys.slots);
    }
    const v = this.#views.get(p.poolId);
    const current = v !== undefined && v.keys.slots === p.keys.slots ? v : undefined;
    if (current) {
      const held = this.now() - p.grantedAt;
      if (outcome !== undefined && !this.#closed) this.#learn(current, outcome, held, current.count);
      if (current.count > 0) current.count--;
      current.avgHoldMs = nextAvgHold(current.avgHoldMs, held);
    }
    // While close() runs, a lease it has not taken over yet is released here; after that, close() did it.
    if (this.#closed && set === undefined) return;
    this.#sendRelease(p.keys, p.leaseId, current);
  }

  #sendRelease(keys: PoolKeys, leaseId: string, v?: PoolView): void {
    if (!this.connected) {
      this.#unsent.set(leaseId, { keys, leaseId });
      return;
    }
    if (v) v.unacked++;
    this.#releases.add(keys, { leaseId, v, done: null, fail: null });
    this.#scheduleTurn();
  }

  /** Sends this turn's calls at the end of the turn (every caller of the turn is in by then). */
  #scheduleTurn(): void {
    if (this.#turnScheduled) return;
    this.#turnScheduled = true;
    setImmediate(() => {
      this.#turnScheduled = false;
      this.#sendTurn();
    });
  }

  /** Releases first: a slot freed in this turn is free for the acquires of the same turn. */
  #sendTurn(): void {
    this.#releases.flush();
    this.#acquires.flush();
  }

  /** One ACQUIRE call for a pool's callers of this turn, in arrival order. */
  #sendAcquires(v: PoolView, calls: AcquireCall[]): void {
    const keys = v.keys;
    const g = v.group;
    const keyList = [keys.slots, keys.eff, keys.line, keys.lineExp, keys.rate, keys.pause];
    const args = [this.nodeId, String(this.#lineTtlMs), String(v.active ? v.limits.maxConcurrent : 0), String(calls.length)];
    for (const c of calls) args.push(c.w.leaseId, String(c.w.termMs), String(c.mode), c.more ? '1' : '0');
    if (g !== null && g.budgetMax !== null) {
      args.push(String(g.budgetMax), String(v.limits.reservedConcurrent));
      for (const m of g.members) {
        if (m === v) continue;
        keyList.push(m.keys.slots);
        args.push(String(m.limits.reservedConcurrent));
      }
    }
    this.#eval(ACQUIRE, keyList, args).then(
      (r) => {
        const reply = r as number[];
        // Replies come in order on one connection: this count reflects every release answered before it.
        if (v.keys === keys) {
          v.count = Math.max(0, reply[0]! - v.unacked);
          v.stored = reply[1]!;
        }
        for (let i = 0; i < calls.length; i++) calls[i]!.settle(reply[i + 2]!);
      },
      (err: unknown) => {
        for (const c of calls) c.fail(err);
      },
    );
  }

  /** One RELEASE call for the leases of one pool's keys released in this turn. */
  #sendReleases(keys: PoolKeys, calls: ReleaseCall[]): void {
    const g = this.#groups.get(keys.tag);
    const args = [...this.#wakeArgs(keys.tag), g !== undefined && g.budgetMax !== null ? '1' : '0'];
    for (const c of calls) args.push(c.leaseId);
    this.#eval(RELEASE, [keys.slots, keys.line], args).then(
      (r) => {
        const reply = r as number[];
        this.#remember(keys, calls);
        for (let i = 0; i < calls.length; i++) {
          const c = calls[i]!;
          if (c.v) {
            c.v.unacked--;
            if (c.v.keys === keys) c.v.count = Math.max(0, reply[0]! - c.v.unacked);
          }
          c.done?.(reply[i + 1] === 1);
        }
        const now = this.#groups.get(keys.tag);
        if (now) this.#pump(now);
      },
      (err: unknown) => {
        for (const c of calls) {
          if (c.v) c.v.unacked--;
          // The lock API answers the failure itself (503); a permit's release is sent again after the reconnect.
          if (c.fail) c.fail(err);
          else this.#unsent.set(c.leaseId, { keys, leaseId: c.leaseId });
        }
        this.#lost(keys.tag);
      },
    );
  }

  /**
   * RELEASE's wake-up: the publish command, its channel and message. One server: PUBLISH on one channel every
   * node listens to, the tag as message. Cluster: SPUBLISH on the tag's own channel, which hashes to the
   * slot of the keys the script touches (a plain PUBLISH would be broadcast to every node of the cluster).
   */
  #wakeArgs(tag: string): [string, string, string] {
    return this.#cluster ? ['SPUBLISH', this.#tagChannel(tag), tag] : ['PUBLISH', this.#channel, tag];
  }

  #tagChannel(tag: string): string {
    return `${this.#prefix}${tag}:freed`;
  }

  /** Cluster: listens on the wake-up channel of every tag this node has pools in (once per tag). */
  #subscribeTags(): void {
    if (!this.#cluster) return;
    const tags = [...this.#groups.keys()].filter((t) => !this.#subscribed.has(t));
    if (tags.length === 0) return;
    for (const t of tags) this.#subscribed.add(t);
    // Each channel on its own: sharded channels of different slots cannot share one SSUBSCRIBE.
    for (const t of tags) {
      this.#sub.ssubscribe(this.#tagChannel(t)).catch(() => {
        this.#subscribed.delete(t);
      });
    }
  }

  #remember(keys: PoolKeys, calls: ReleaseCall[]): void {
    const at = this.now();
    for (const c of calls) this.#recent.push({ keys, leaseId: c.leaseId, at });
    // Drop what is older than the replay window (and keep the list bounded).
    let drop = 0;
    while (drop < this.#recent.length && (this.#recent[drop]!.at < at - REPLAY_MS || this.#recent.length - drop > REPLAY_MAX)) drop++;
    if (drop > 64 || drop === this.#recent.length) this.#recent = this.#recent.slice(drop);
  }

  /**
   * Redis went away under this node (the connection, or a command on a Cluster primary): releases it
   * acknowledged just before may not have reached the replica that takes over; they are sent again once
   * Redis answers (#resend).
   */
  #lost(tag?: string): void {
    const from = this.now() - REPLAY_MS;
    if (this.#replayFrom === null || from < this.#replayFrom) this.#replayFrom = from;
    // The leases this node holds there are written again before it admits there (#writeBack). On a Cluster, a
    // failed command names one primary: only its tag's keys (a loss elsewhere does not hold up this one).
    const mark = ++this.#lossMark;
    for (const [slots, set] of this.#held) {
      if (tag !== undefined && this.#cluster && set.values().next().value?.keys.tag !== tag) continue;
      this.#rewrite.set(slots, mark);
    }
    if (this.#cluster) this.#scheduleResend();
  }

  /**
   * Cluster: a command to this group's primary failed. Its waiters get the failure policy now (as every waiter
   * does when a single server's connection drops), and so do newcomers for SLOT_DOWN_MS.
   */
  #slotDown(g: Group): void {
    g.downUntil = this.now() + SLOT_DOWN_MS;
    for (const m of g.members) {
      for (let w = m.queue.peek(); w !== null; w = m.queue.peek()) {
        if (w.attempting) break;
        m.queue.remove(w);
        this.#failWaiter(w);
      }
    }
  }

  #scheduleResend(): void {
    if (this.#resendTimer !== null || this.#closed) return;
    this.#resendTimer = setTimeout(() => {
      this.#resendTimer = null;
      // Also writes back this node's leases and its fallback's slots on the primary that took over.
      this.#refreshAll();
    }, 250);
    this.#resendTimer.unref();
  }

  /** Sends the releases that could not be sent, and replays the recent ones after a failover. */
  #resend(): void {
    if (!this.connected) return;
    if (this.#replayFrom !== null) {
      const from = this.#replayFrom;
      this.#replayFrom = null;
      for (const r of this.#recent) if (r.at >= from && !this.#unsent.has(r.leaseId)) this.#unsent.set(r.leaseId, { keys: r.keys, leaseId: r.leaseId });
    }
    for (const [id, u] of this.#unsent) {
      this.#unsent.delete(id);
      this.#sendRelease(u.keys, u.leaseId);
    }
  }

  /** A wake-up (pub/sub) for a tag: pump that group's waiters. */
  #wake(tag: string): void {
    const g = this.#groups.get(tag);
    if (g) this.#pump(g);
  }

  /** The timed retry behind pub/sub: 1–2× retryMs, jittered so nodes do not retry in step. */
  #schedule(g: Group): void {
    if (g.timer !== null || this.#closed) return;
    g.timer = this.#timers.setTimeout(this.#retry, this.#retryMs * (1 + this.#random()), g);
  }

  readonly #retry = (g: Group): void => {
    g.timer = null;
    this.#pump(g);
  };

  /**
   * Admits this node's waiters of a group, oldest first (across the budget's pools), one attempt at a time,
   * until one is refused. A trigger that arrives meanwhile (dirty) earns one more try.
   */
  #pump(g: Group): void {
    if (this.#closed) return;
    if (g.pumping) {
      g.dirty = true;
      return;
    }
    // The oldest head whose pool looks open from here; else the oldest head (our counts may be stale:
    // other nodes release too).
    let best: Waiter | null = null;
    let oldest: Waiter | null = null;
    for (const m of g.members) {
      const head = m.queue.peek();
      if (head === null) continue;
      if (oldest === null || head.seq < oldest.seq) oldest = head;
      if ((best === null || head.seq < best.seq) && m.count < m.effectiveLimit()) best = head;
    }
    best ??= oldest;
    if (best === null) {
      // Nobody queued yet, but a newcomer's refused first answer may still be on its way (the wake-up came on
      // the other connection first): it tries again as soon as it queues, not a timed retry later.
      if (g.members.some((m) => m.pending > 0)) g.dirty = true;
      return;
    }
    if (!this.connected) {
      this.#schedule(g);
      return;
    }
    g.pumping = true;
    g.dirty = false;
    const w = best;
    void this.#attempt(w, Attempt.Queued).then((admitted) => {
      g.pumping = false;
      if (this.#groups.get(g.tag) !== g) {
        const now = this.#groups.get(g.tag);
        if (now) this.#pump(now);
        return;
      }
      if (admitted || g.dirty) this.#pump(g);
      else this.#schedule(g);
    });
  }

  #eval(s: Script, keys: string[], args: string[]): Promise<unknown> {
    return this.redis.evalsha(s.sha, keys.length, ...keys, ...args).catch((err: unknown) => {
      if (!(err instanceof Error) || !err.message.startsWith('NOSCRIPT')) throw err;
      // This server does not know it (a restart, a promoted replica, a Cluster node not loaded yet): EVAL runs
      // it on the node of its keys and leaves it cached there, so later calls go by hash again.
      return this.redis.eval(s.source, keys.length, ...keys, ...args);
    });
  }

  /** Loads the scripts on the server (every primary of a Cluster), so a first call is not a second trip. */
  async #loadScripts(scripts: readonly Script[]): Promise<void> {
    const targets = isCluster(this.redis) ? this.redis.nodes('master') : [this.redis];
    await Promise.all(targets.flatMap((r) => scripts.map((s) => r.script('LOAD', s.source))));
  }

  async #connected(): Promise<void> {
    try {
      await this.#loadScripts([...SCRIPTS, ...this.#extraScripts]);
    } catch {
      // One server: dropped again, the next ready event retries. A Cluster may be ready with one primary
      // away: its scripts load by EVAL at their first call there.
      if (!this.#cluster) return;
    }
    this.#up = true;
    this.#markReady();
    this.#onConnection(true);
    // Leases this node still holds are written back (Redis may have restarted empty), releases that could not
    // be sent are sent, then waiters get a try.
    this.#refreshAll();
    for (const g of this.#groups.values()) this.#pump(g);
  }

  #disconnected(): void {
    if (!this.#up) return;
    this.#up = false;
    this.#lost();
    this.#onConnection(false);
    // Nobody can be admitted through Redis now: waiters are refused (closed) or moved to the local limit (open).
    for (const v of this.#views.values()) {
      for (let w = v.queue.peek(); w !== null; w = v.queue.peek()) {
        v.queue.remove(w);
        this.#failWaiter(w);
      }
    }
  }

  #refreshAll(): void {
    if (!this.connected) return;
    // Releases that failed on a Cluster whose other primaries stayed up (no reconnect to resend them then).
    this.#resend();
    for (const slots of new Set([...this.#held.keys(), ...this.#fallbackHeld.keys()])) void this.#refreshKey(slots);
    this.#moveFallbackWaits();
  }

  /**
   * Redis answering again: a promise while `v`'s group has slots of this node that Redis may not count (the
   * fallback's not yet written; leases granted before Redis, or the key's primary, went away, which a promoted
   * replica may have missed), settled once they are written (their write is started here); null when none.
   * Until then the group admits nothing through Redis: the script would not count them, and the origin would
   * see more than max_concurrent (seen: 7 of 6 on a Cluster once its primary was back).
   */
  #writeBack(v: PoolView): Promise<boolean> | null {
    if (this.#fallbackHeld.size === 0 && this.#rewrite.size === 0) return null;
    let writes: Promise<boolean>[] | null = null;
    for (const m of v.group?.members ?? [v]) {
      const slots = m.keys.slots;
      if (this.#unwritten(slots) || (this.#rewrite.has(slots) && this.#held.has(slots))) (writes ??= []).push(this.#refreshKey(slots));
    }
    return writes === null ? null : Promise.all(writes).then((ok) => ok.every(Boolean));
  }

  #unwritten(slots: string): boolean {
    const set = this.#fallbackHeld.get(slots);
    if (set !== undefined) for (const p of set) if (!p.written) return true;
    return false;
  }

  /**
   * Refreshes this node's leases in one slots key and writes the fallback's slots in use there as leases.
   * Settles true once they are all in Redis (false when the write failed); a write already on its way is
   * joined.
   */
  #refreshKey(slots: string): Promise<boolean> {
    const on = this.#writing.get(slots);
    if (on !== undefined) return on;
    const ids: string[] = [];
    const held = this.#held.get(slots);
    const permits = held === undefined ? [] : [...held];
    for (const p of permits) ids.push(p.leaseId);
    // The fallback's slots still in use become leases (written once; then refreshed like the others).
    const fallback = [...(this.#fallbackHeld.get(slots) ?? [])];
    for (const p of fallback) ids.push(p.leaseId);
    const mark = this.#rewrite.get(slots);
    if (ids.length === 0) {
      this.#rewrite.delete(slots);
      return Promise.resolve(true);
    }
    const tag = (permits[0] ?? fallback[0])!.keys.tag;
    const write = this.#eval(REFRESH, [slots], [String(this.#termMs), ...ids]).then(
      () => {
        this.#writing.delete(slots);
        if (mark !== undefined && this.#rewrite.get(slots) === mark) this.#rewrite.delete(slots);
        // Released while the write was on its way: the write may have landed after the release and brought the
        // lease back (a Cluster client sends a command that met a failover again to the new primary, later than
        // a release sent after it; a soak run found two such leases left for a term). Released again now, after
        // the write's answer, so the release is the last word.
        const current = this.#held.get(slots);
        for (const p of permits) if (current?.has(p) !== true && !this.#closed) this.#sendRelease(p.keys, p.leaseId);
        for (const p of fallback) {
          // Released while the write was on its way: its lease goes too.
          if (!p.written && !this.#fallbackHeld.get(slots)?.has(p)) this.#sendRelease(p.keys, p.leaseId);
          p.written = true;
        }
        // Granted by the fallback while this write was on its way (Redis not answering for it then): written
        // next, before the pool admits through Redis again.
        if (this.#unwritten(slots) && this.connected) return this.#refreshKey(slots);
        return true;
      },
      () => {
        this.#writing.delete(slots);
        if (this.#cluster) {
          this.#lost(tag);
          const g = this.#groups.get(tag);
          if (g) this.#slotDown(g);
        }
        return false;
      },
    );
    this.#writing.set(slots, write);
    return write;
  }

  /**
   * What this node's learners of a pool know (diagnostics and tests); null for an unknown pool. The gate
   * itself lives in Redis: its wait is as the last script reply said.
   */
  learned(poolId: number): LearnedState | null {
    const v = this.#views.get(poolId);
    return v === undefined ? null : learnedState(v.adaptive, v.rpm, Math.max(0, v.gateUntil - this.now()));
  }

  state(poolId: number): PoolState {
    const v = this.#views.get(poolId);
    if (v === undefined) return EMPTY_STATE;
    let remaining = rules.remaining(v, this.now());
    const g = v.group;
    if (g !== null && g.budgetMax !== null) {
      // The budget's counts as last seen, for its headroom.
      const share = new BudgetShare<PoolView>(0, g.budgetMax);
      share.members.push(...g.members);
      share.recount((m) => m.waiting);
      remaining = Math.min(remaining, share.headroom(v));
    }
    return { inFlight: v.count, queued: v.waiting, effectiveLimit: v.effectiveLimit(), remaining };
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#refreshTimer);
    if (this.#resendTimer !== null) clearTimeout(this.#resendTimer);
    for (const g of this.#groups.values()) if (g.timer !== null) this.#timers.clearTimeout(g.timer);
    for (const v of this.#views.values()) this.#refuseAll(v, 'unavailable');
    await this.#fallback?.close();
    // Calls of this turn go out; once they are answered, a slot granted to a caller that is gone is released.
    this.#sendTurn();
    if (this.connected) await this.redis.ping().catch(() => {});
    // Leases still held are released so the slots do not wait out a term.
    const sends: Promise<unknown>[] = [];
    if (this.connected) {
      for (const set of this.#held.values()) {
        for (const p of set) sends.push(this.#eval(RELEASE, [p.keys.slots, p.keys.line], [...this.#wakeArgs(p.keys.tag), '0', p.leaseId]).catch(() => {}));
      }
      for (const set of this.#fallbackHeld.values()) {
        for (const p of set) if (p.written) sends.push(this.#eval(RELEASE, [p.keys.slots, p.keys.line], [...this.#wakeArgs(p.keys.tag), '0', p.leaseId]).catch(() => {}));
      }
    }
    this.#held.clear();
    this.#fallbackHeld.clear();
    this.#sendTurn();
    await Promise.all(sends);
    this.#sub.disconnect();
    await Promise.race([this.redis.quit().catch(() => {}), new Promise((r) => setTimeout(r, QUIT_WAIT_MS).unref())]);
    await Promise.all([endClient(this.redis), endClient(this.#sub)]);
  }
}

/** How long close() lets QUIT be answered before it drops the connections. */
const QUIT_WAIT_MS = 1000;

/** The data plane's Redis governor from the service config; waits briefly for Redis, then starts anyway (fail policy applies). */
export async function redisGovernorFromConfig(
  target: RedisTarget,
  config: { governorFailurePolicy: FailurePolicy; governorFailOpenDivisor: number; governorLeaseTermMs: number },
  log: { warn(obj: object, msg: string): void; info(obj: object, msg: string): void },
  time: Readonly<GovernorTime> = SYSTEM_TIME,
): Promise<RedisGovernor> {
  let wasUp = false;
  const gov = new RedisGovernor({
    ...time,
    target,
    failurePolicy: config.governorFailurePolicy,
    failOpenDivisor: config.governorFailOpenDivisor,
    termMs: config.governorLeaseTermMs,
    onConnection: (up, err) => {
      if (up === wasUp) return;
      wasUp = up;
      if (up) log.info({ redis: describeTarget(target) }, 'redis governor connected');
      else log.warn({ err, redis: describeTarget(target), policy: config.governorFailurePolicy }, 'redis governor lost its connection; reconnecting');
    },
  });
  await gov.ready().catch((err: unknown) => log.warn({ err }, 'redis governor: Redis not reachable at start; admissions follow the failure policy until it is'));
  return gov;
}
