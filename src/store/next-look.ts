// The timer of a store poller's next look (the job runner's, the webhook deliverer's): each caller asks for a look
// some time from now, and the earliest asked for wins, so a poller can sleep until the store's next due moment and
// still look sooner when something happens meanwhile.

/** The shortest sleep before a due moment: a moment a few ms ahead does not cost a look per ms. */
const MIN_SLEEP_MS = 10;

/** How long to sleep for a moment `inMs` ahead (> 0), at most `maxMs`. */
export function sleepUntil(inMs: number, maxMs: number): number {
  return Math.min(maxMs, Math.max(MIN_SLEEP_MS, Math.ceil(inMs)));
}

export class NextLook {
  readonly #look: () => void;
  #timer: NodeJS.Timeout | null = null;
  /** When the armed look is due (performance.now ms; Infinity: none armed). */
  #at = Infinity;
  #closed = false;

  /** `look` runs when the armed moment comes (the timer is unref'd: it never keeps the process alive). */
  constructor(look: () => void) {
    this.#look = look;
  }

  /** Arms the look `ms` from now, unless one is armed sooner. */
  in(ms: number): void {
    if (this.#closed) return;
    const at = performance.now() + ms;
    if (this.#timer !== null) {
      if (this.#at <= at) return;
      clearTimeout(this.#timer);
    }
    this.#at = at;
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#at = Infinity;
      this.#look();
    }, ms);
    this.#timer.unref();
  }

  /** No more looks. */
  close(): void {
    this.#closed = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
  }
}
