// Pool limits as every governor takes them: counts made whole and non-negative, optional fields settled.
import type { PoolLimits, PoolState } from './governor.js';
import { AdaptiveLimit } from './adaptive-limit.js';

export function sanitizeLimits(l: PoolLimits): PoolLimits {
  const count = (n: number): number => (Number.isFinite(n) && n > 0 ? Math.floor(n) : 0);
  return {
    poolId: l.poolId,
    maxConcurrent: count(l.maxConcurrent),
    queueLength: count(l.queueLength),
    queueTimeoutMs: count(l.queueTimeoutMs),
    budgetId: l.budgetId,
    reservedConcurrent: count(l.reservedConcurrent),
    adaptive: l.adaptive === true,
    adaptiveMin: Math.max(1, count(l.adaptiveMin ?? 1)),
    rpmOverride: l.rpmOverride !== undefined && l.rpmOverride !== null && l.rpmOverride > 0 && Number.isFinite(l.rpmOverride) ? l.rpmOverride : null,
  };
}

export const EMPTY_STATE: PoolState = Object.freeze({ inFlight: 0, queued: 0, effectiveLimit: 0, remaining: 0 });

/** A pool's adaptive limit under new limits: null while off, a fresh one when switched (back) on, else re-bounded. */
export function nextAdaptive(a: AdaptiveLimit | null, limits: PoolLimits): AdaptiveLimit | null {
  if (!limits.adaptive || limits.maxConcurrent === 0) return null;
  const min = Math.min(limits.adaptiveMin ?? 1, limits.maxConcurrent);
  if (a === null) return new AdaptiveLimit({ min, max: limits.maxConcurrent });
  a.setBounds(min, limits.maxConcurrent);
  return a;
}
