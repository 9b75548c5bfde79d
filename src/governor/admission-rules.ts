// The admission rules, written once: what a pool may take now, the order a newcomer is decided in, the
// budget's oldest-first hand-over and the RPM gate's wake-up. Each governor is a store of slot state under
// these rules (memory: objects; shared-memory: a row of a SharedArrayBuffer, under its lock; Redis: its Lua
// scripts decide, the rest of the order is shared from here).
import type { Admission, RefusalReason } from './governor.js';
import type { BudgetShare } from './budget-share.js';
import { MAX_TIMER_MS, type GovernorTimers } from './clock.js';
import { gateRetryHintMs, nextAvgHold, retryHintMs } from './outcome-learning.js';

/**
 * What the rules read of one pool, however its store keeps it. Netflix concurrency-limits' split: the Limit
 * (adaptive-limit.ts, rpm-learner.ts) is pure algorithm; this is the Limiter's side. The Redis governor's
 * pools are this much (its scripts count and hand over slots); memory and shared-memory pools are SlotState.
 */
export interface SlotCounts {
  readonly inFlight: number;
  readonly reservedConcurrent: number;
  /** Waiters in the pool's FIFO. */
  readonly queued: number;
  readonly queueLength: number;
  readonly queueTimeoutMs: number;
  /** Moving average of hold times (the retry hint's basis). */
  avgHoldMs: number;
  /** The budget share the pool is a member of, when its budget is capped (and its store counts it). */
  readonly budget: BudgetShare<SlotCounts> | null;
  /** The one place the effective limit is computed: min(max_concurrent, adaptive); 0 when not active. */
  effectiveLimit(): number;
  /** Whether the RPM gate lets one request through now; rpmWaitMs: ms until it does (0 when open). */
  rpmAllows(now: number): boolean;
  rpmWaitMs(now: number): number;
}

/**
 * A pool whose slots are counted and handed over here: every change of `inFlight` goes through take() and
 * give() below, and pump() hands freed slots to its waiters.
 */
export interface SlotState extends SlotCounts {
  inFlight: number;
  readonly budget: BudgetShare<SlotState> | null;
  /** False once the pool left the configuration (or the governor closed): its waiters need no wake-up. */
  readonly active: boolean;
  /** Counts one admitted request at the RPM gate. */
  rpmTake(now: number): void;
  /** Arrival order of the oldest waiter (smaller is older); only called while `queued > 0`. */
  headSeq(): number;
  /** Hands a slot to the oldest waiter (take() first, then its answer). */
  grantHead(now: number): void;
  /** The RPM gate's wake-up for waiters it holds back; null while none is armed. */
  gateTimer: unknown;
  readonly timers: GovernorTimers;
  /** The gate reopened: admit waiters (under whatever lock the store needs). */
  gateOpened(): void;
}

/** decide(): take a slot now. */
export const TAKE = -1;

/** Whether the pool may take one more slot now: under its limit, its budget's share and its RPM gate. */
export function canTake(s: SlotCounts, now: number): boolean {
  return s.inFlight < s.effectiveLimit() && (s.budget === null || s.budget.admits(s)) && s.rpmAllows(now);
}

/** Slots the pool could take now (a shut RPM gate takes nothing, whatever slots are free). */
export function remaining(s: SlotCounts, now: number): number {
  if (!s.rpmAllows(now)) return 0;
  const own = Math.max(0, s.effectiveLimit() - s.inFlight);
  return s.budget === null ? own : Math.min(own, s.budget.headroom(s));
}

/** Counts one slot taken (before the caller is answered). */
export function take(s: SlotState, now: number): void {
  s.budget?.take(s);
  s.inFlight++;
  s.rpmTake(now);
}

/** Counts one slot given back; false when none was counted (never go negative). */
export function give(s: SlotState): boolean {
  if (s.inFlight === 0) return false;
  s.budget?.give(s);
  s.inFlight--;
  return true;
}

/** Adds one hold time to the moving average behind the retry hint. */
export function noteHold(s: SlotState, held: number): void {
  s.avgHoldMs = nextAvgHold(s.avgHoldMs, held);
}

/** When a slot may free, in whole seconds (see retryHintMs). */
export function retryAfterMs(s: SlotCounts): number {
  return retryHintMs(s.avgHoldMs, s.queued, s.effectiveLimit());
}

/** A refusal before any wait, with its retry hint. */
export function refuse(s: SlotCounts, reason: RefusalReason): Admission {
  return { ok: false, reason, queuedMs: 0, retryAfterMs: retryAfterMs(s) };
}

/**
 * The decision order for a newcomer of an active pool: TAKE when its queue is empty and a slot is free (a
 * newcomer never overtakes a waiter of its own pool); else a refusal (the RPM gate will not open within
 * the wait; no wait asked; the queue is full); else the ms it may wait in the queue (> 0).
 */
export function decide(s: SlotCounts, reqWaitMs: number, now: number): number | Admission {
  if (s.queued === 0 && canTake(s, now)) return TAKE;
  const waitMs = Math.min(reqWaitMs, s.queueTimeoutMs);
  const gateWait = s.rpmWaitMs(now);
  if (gateWait > 0 && !(gateWait <= waitMs)) return { ok: false, reason: 'rate_limited', queuedMs: 0, retryAfterMs: gateRetryHintMs(gateWait) };
  return queueRefusal(s, waitMs) ?? waitMs;
}

/**
 * The part of the order every store shares, Redis's included (its script decides the rest): no wait asked
 * is `no_slot`, a full queue `queue_full`; null when the caller may wait. `queued` is what the store counts
 * as waiting (Redis adds newcomers whose first answer is on its way).
 */
export function queueRefusal(s: SlotCounts, waitMs: number): Admission | null {
  if (!(waitMs > 0)) return refuse(s, 'no_slot');
  if (s.queued >= s.queueLength) return refuse(s, 'queue_full');
  return null;
}

/** Whether a caller may wait in the queue (queueRefusal would be null), without making a refusal. */
export function mayQueue(s: SlotCounts, waitMs: number): boolean {
  return waitMs > 0 && s.queued < s.queueLength;
}

/**
 * Admits waiters while capacity allows: the pool's own FIFO, or the budget's when it shares one. Nobody
 * waiting (the common release): nothing to hand over, no clock read.
 */
export function pump(s: SlotState, now: () => number): void {
  const b = s.budget;
  if (b === null ? s.queued === 0 : b.waiting === 0) return;
  const t = now();
  if (b !== null) {
    pumpBudget(b, t);
    return;
  }
  while (s.queued > 0 && canTake(s, t)) s.grantHead(t);
  armGate(s, t);
}

/**
 * A slot freed (or limits changed) in a budget: admit the oldest waiter, across all of the budget's pools,
 * whose pool may take a slot now; repeat until none may. Oldest-first by arrival is the fairness rule.
 */
export function pumpBudget(b: BudgetShare<SlotState>, now: number): void {
  const members = b.members;
  while (b.waiting > 0) {
    let best: SlotState | null = null;
    let bestSeq = 0;
    for (let i = 0; i < members.length; i++) {
      const m = members[i]!;
      if (m.queued === 0) continue;
      const seq = m.headSeq();
      if ((best === null || seq < bestSeq) && canTake(m, now)) {
        best = m;
        bestSeq = seq;
      }
    }
    if (best === null) break;
    best.grantHead(now);
  }
  if (b.waiting > 0) for (const m of members) armGate(m, now);
}

/** Arms the wake-up for waiters the RPM gate holds back (nothing else would wake them). */
export function armGate(s: SlotState, now: number): void {
  if (s.gateTimer !== null || s.queued === 0 || !s.active) return;
  const wait = s.rpmWaitMs(now);
  if (wait > 0) s.gateTimer = s.timers.setTimeout(onGateOpen, Math.min(Math.ceil(wait), MAX_TIMER_MS), s);
}

export function disarmGate(s: SlotState): void {
  if (s.gateTimer !== null) s.timers.clearTimeout(s.gateTimer);
  s.gateTimer = null;
}

function onGateOpen(s: SlotState): void {
  s.gateTimer = null;
  s.gateOpened();
}
