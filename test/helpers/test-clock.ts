// The service's clock as a test drives it (issue 28 §1): startService takes `now`, and the data plane's
// per-request checks (key expiry), the lease registry's terms, the wire listeners and the job intake all
// read it. A TestClock follows real time and can be moved ahead, so a test about a deadline jumps over it
// instead of sleeping through it. It only moves forward: what was granted before a jump is simply older.

import type { GovernorTime, GovernorTimers } from '../../src/governor/clock.js';

export class TestClock {
  #aheadMs = 0;

  /** The service's `now` (pass it as startTestService's `now`). */
  readonly now = (): Date => new Date(Date.now() + this.#aheadMs);

  /** Moves the clock ahead by `ms`; returns the new time in Unix ms. */
  advance(ms: number): number {
    if (ms < 0) throw new Error('a TestClock only moves forward');
    this.#aheadMs += ms;
    return this.now().getTime();
  }
}

/**
 * The in-memory governor's time as a test drives it (startTestService's `governorTime`): its clock and its
 * timers (queue timeouts, the RPM gate, retries) stand still until `advance` moves them, and a timer runs when
 * the time passes its deadline, in deadline order. The wall clock stays real (dates in headers).
 */
export class DrivenGovernorTime implements GovernorTime, GovernorTimers {
  #now = 1_000_000;
  #seq = 0;
  readonly #due: Array<{ at: number; seq: number; fn: (arg: never) => void; arg: unknown; cancelled: boolean }> = [];

  readonly now = (): number => this.#now;
  readonly wallClock = (): number => Date.now();
  readonly random = Math.random;
  get timers(): GovernorTimers {
    return this;
  }

  setTimeout<T>(fn: (arg: T) => void, ms: number, arg: T): unknown {
    const timer = { at: this.#now + Math.max(0, ms), seq: this.#seq++, fn: fn as (arg: never) => void, arg, cancelled: false };
    this.#due.push(timer);
    return timer;
  }

  clearTimeout(handle: unknown): void {
    if (handle) (handle as { cancelled: boolean }).cancelled = true;
  }

  /** Timers not yet run nor cleared. */
  get pending(): number {
    return this.#due.filter((x) => !x.cancelled).length;
  }

  /** Moves the governor's time ahead by `ms`, running each timer whose deadline it passes. */
  advance(ms: number): void {
    if (ms < 0) throw new Error('governor time only moves forward');
    const to = this.#now + ms;
    for (;;) {
      const next = this.#due.filter((x) => !x.cancelled && x.at <= to).sort((a, b) => a.at - b.at || a.seq - b.seq)[0];
      if (!next) break;
      next.cancelled = true;
      this.#due.splice(this.#due.indexOf(next), 1);
      this.#now = next.at;
      (next.fn as (arg: unknown) => void)(next.arg);
    }
    this.#now = to;
    for (let i = this.#due.length - 1; i >= 0; i--) if (this.#due[i]!.cancelled) this.#due.splice(i, 1);
  }
}
