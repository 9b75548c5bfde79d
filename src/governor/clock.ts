// Time and randomness as every governor takes them: passed in (the service passes the system's), never read
// directly inside the governor, so tests and simulations run the same rules on fake time (Netflix's nanoClock,
// envoy's TimeSource).
import { performance } from 'node:perf_hooks';

/** setTimeout's largest delay; a longer wait would fire at once. */
export const MAX_TIMER_MS = 2_147_483_647;

/** The timer functions a governor uses; a simulation passes its own with simulated time. */
export interface GovernorTimers {
  setTimeout<T>(fn: (arg: T) => void, ms: number, arg: T): unknown;
  clearTimeout(handle: unknown): void;
}

export const NODE_TIMERS: GovernorTimers = {
  setTimeout: (fn, ms, arg) => setTimeout(fn, ms, arg),
  clearTimeout: (handle) => clearTimeout(handle as NodeJS.Timeout),
};

/** Everything a governor reads about time and chance. */
export interface GovernorTime {
  /** Monotonic clock in ms (hold times, waits, the RPM gate, the adaptive limit's samples). */
  now: () => number;
  /** Wall-clock time in epoch ms, for dates in rate-limit headers. */
  wallClock: () => number;
  /** Timers for waits, the RPM gate and retries; must follow the same clock as `now`. */
  timers: GovernorTimers;
  /** Uniform in [0, 1): jitter of timed retries. */
  random: () => number;
}

/** The system's time for one thread: performance.now(), Date.now(), Node's timers, Math.random(). */
export const SYSTEM_TIME: Readonly<GovernorTime> = Object.freeze({
  now: () => performance.now(),
  wallClock: () => Date.now(),
  timers: NODE_TIMERS,
  random: Math.random,
});

const ORIGIN = performance.timeOrigin;

/**
 * The system's time with a monotonic clock every thread of the process agrees on (each thread's
 * performance.now() has its own origin): what the shared-memory governor needs.
 */
export const PROCESS_TIME: Readonly<GovernorTime> = Object.freeze({ ...SYSTEM_TIME, now: () => ORIGIN + performance.now() });

/** The options' time with the defaults filled in. */
export function timeFrom(opts: Partial<GovernorTime>, defaults: Readonly<GovernorTime>): GovernorTime {
  return {
    now: opts.now ?? defaults.now,
    wallClock: opts.wallClock ?? defaults.wallClock,
    timers: opts.timers ?? defaults.timers,
    random: opts.random ?? defaults.random,
  };
}
