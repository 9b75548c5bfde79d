// The service's clock as a test drives it (issue 28 §1): startService takes `now`, and the data plane's
// per-request checks (key expiry), the lease registry's terms, the wire listeners and the job intake all
// read it. A TestClock follows real time and can be moved ahead, so a test about a deadline jumps over it
// instead of sleeping through it. It only moves forward: what was granted before a jump is simply older.

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
