// Capacity budget arithmetic: whether one pool of a budget may take one more slot of the shared origin.

/** Slots of one budget's counts: max, in-flight, borrowed, waiting, Σ reserved. */
export const BUDGET_FIELDS = 5;
const MAX = 0;
const IN_FLIGHT = 1;
const BORROWED = 2;
const WAITING = 3;
const RESERVED_SUM = 4;

/** What the share needs to know of a member pool. */
export interface BudgetMember {
  readonly inFlight: number;
  readonly reservedConcurrent: number;
}

/**
 * One Capacity budget with a cap (`originMaxConcurrent`). Each member is guaranteed its reserve; beyond
 * it, members borrow from `unallocated = max − Σ reserved`. Slots a member holds above its reserve are
 * "borrowed", so Σ in-flight = Σ min(inFlight, reserved) + borrowed ≤ Σ reserved + unallocated = max.
 * The share keeps running totals (updated on every take and give) so a check is O(1); `recount`
 * rebuilds them from the members after a configuration change.
 */
export class BudgetShare<M extends BudgetMember> {
  readonly budgetId: number;
  readonly members: M[] = [];
  /** The counts, in BUDGET_FIELDS slots: a view into shared memory lets several threads share one budget. */
  readonly #s: Int32Array;

  /** `store` (BUDGET_FIELDS long) holds the counts; `init` false attaches to counts another thread keeps. */
  constructor(budgetId: number, max: number, store: Int32Array = new Int32Array(BUDGET_FIELDS), init = true) {
    this.budgetId = budgetId;
    this.#s = store;
    if (init) {
      store.fill(0);
      store[MAX] = max;
    }
  }

  get max(): number {
    return this.#s[MAX]!;
  }

  /** Σ in-flight over the members. */
  get inFlight(): number {
    return this.#s[IN_FLIGHT]!;
  }
  set inFlight(n: number) {
    this.#s[IN_FLIGHT] = n;
  }

  /** Σ max(0, inFlight − reserved) over the members. */
  get borrowed(): number {
    return this.#s[BORROWED]!;
  }
  set borrowed(n: number) {
    this.#s[BORROWED] = n;
  }

  /** Σ queued waiters over the members, so a release with nobody waiting skips the scan. */
  get waiting(): number {
    return this.#s[WAITING]!;
  }
  set waiting(n: number) {
    this.#s[WAITING] = n;
  }

  get unallocated(): number {
    return Math.max(0, this.max - this.#s[RESERVED_SUM]);
  }

  /**
   * May a member holding `inFlight` slots take one more? Its own limit is the caller's check. The hard
   * cap comes first: after a live change where Σ reserved > max or members hold more than the new max,
   * even a member below its reserve waits until the budget is under its cap again.
   */
  admits(m: BudgetMember): boolean {
    if (this.inFlight >= this.max) return false;
    return m.inFlight < m.reservedConcurrent || this.borrowed < this.unallocated;
  }

  /** How many more slots the member could take now, budget-wise. */
  headroom(m: BudgetMember): number {
    const own = Math.max(0, m.reservedConcurrent - m.inFlight);
    const borrowable = Math.max(0, this.unallocated - this.borrowed);
    return Math.max(0, Math.min(this.max - this.inFlight, own + borrowable));
  }

  /** Called before the member's in-flight count goes up by one. */
  take(m: BudgetMember): void {
    this.inFlight++;
    if (m.inFlight >= m.reservedConcurrent) this.borrowed++;
  }

  /** Called before the member's in-flight count goes down by one. */
  give(m: BudgetMember): void {
    this.inFlight--;
    if (m.inFlight > m.reservedConcurrent) this.borrowed--;
  }

  recount(waitingOf: (m: M) => number): void {
    this.inFlight = this.borrowed = this.waiting = this.#s[RESERVED_SUM] = 0;
    for (const m of this.members) {
      this.inFlight += m.inFlight;
      this.borrowed += Math.max(0, m.inFlight - m.reservedConcurrent);
      this.waiting += waitingOf(m);
      this.#s[RESERVED_SUM] += m.reservedConcurrent;
    }
  }
}
