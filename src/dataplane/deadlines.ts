// Request deadlines without a Node timer per request. Every forwarded request used to arm its own setTimeout (a
// Timeout object with its async ids, a closure, a timer-list insert and remove); all requests of one timeout length
// expire in the order they started, so one list per length, in start order, and one timer for its head do the same.
// The list is intrusive (the request is its own node: no allocation per request, O(1) removal), so a slow request
// at the head holds nothing but itself.
import { SYSTEM_TIME, type GovernorTime } from '../governor/clock.js';

/** The clock and timers a list reads (the system's by default; a test passes driven time). */
export type DeadlineTime = Pick<GovernorTime, 'now' | 'timers'>;

/** What a DeadlineList holds: the request itself, with its links and its deadline. */
export interface DeadlineNode {
  deadlinePrev: DeadlineNode | null;
  deadlineNext: DeadlineNode | null;
  /** The list's clock reading at which it expires; NaN while not in a list. */
  deadlineAt: number;
  /** Runs once, when the deadline passes before the node is removed. */
  onDeadline(): void;
}

/** The nodes with one timeout length, oldest first, and one timer armed for the oldest. */
export class DeadlineList {
  readonly #ms: number;
  readonly #time: DeadlineTime;
  #head: DeadlineNode | null = null;
  #tail: DeadlineNode | null = null;
  #armed = false;

  constructor(ms: number, time: DeadlineTime = SYSTEM_TIME) {
    this.#ms = ms;
    this.#time = time;
  }

  /** Adds `node`, due `ms` from now. */
  add(node: DeadlineNode): void {
    node.deadlineAt = this.#time.now() + this.#ms;
    node.deadlinePrev = this.#tail;
    node.deadlineNext = null;
    if (this.#tail === null) this.#head = node;
    else this.#tail.deadlineNext = node;
    this.#tail = node;
    // A removed head leaves the timer armed for its deadline: it then finds a later head and re-arms (one timer
    // event per timeout length, not one per request).
    if (!this.#armed) this.#arm(this.#ms);
  }

  /** Takes `node` out (it no longer expires); nothing when it is not in the list. */
  remove(node: DeadlineNode): void {
    if (Number.isNaN(node.deadlineAt)) return;
    node.deadlineAt = NaN;
    const prev = node.deadlinePrev;
    const next = node.deadlineNext;
    if (prev === null) this.#head = next;
    else prev.deadlineNext = next;
    if (next === null) this.#tail = prev;
    else next.deadlinePrev = prev;
    node.deadlinePrev = node.deadlineNext = null;
  }

  #arm(ms: number): void {
    // Node fires a timer no earlier than its whole milliseconds; the check below re-arms for what is left.
    this.#armed = true;
    const timer = this.#time.timers.setTimeout(this.#fire, Math.max(1, Math.ceil(ms)), undefined);
    // The request's own sockets keep the process alive while it runs; an idle list must not.
    (timer as { unref?: () => void } | null)?.unref?.();
  }

  readonly #fire = (): void => {
    this.#armed = false;
    const now = this.#time.now();
    try {
      for (let node = this.#head; node !== null && node.deadlineAt <= now; node = this.#head) {
        this.remove(node);
        node.onDeadline();
      }
    } finally {
      // Re-armed even when an expiry threw (the throw goes on, as it would from a timer of its own).
      if (this.#head !== null && !this.#armed) this.#arm(this.#head.deadlineAt - now);
    }
  };
}

/** One list per timeout length (a pool setting: few distinct values). */
export class Deadlines {
  readonly #lists = new Map<number, DeadlineList>();
  readonly #time: DeadlineTime;

  constructor(time: DeadlineTime = SYSTEM_TIME) {
    this.#time = time;
  }

  /** `node` expires `ms` from now unless taken out first, from the list this returns. */
  add(node: DeadlineNode, ms: number): DeadlineList {
    let list = this.#lists.get(ms);
    if (list === undefined) this.#lists.set(ms, (list = new DeadlineList(ms, this.#time)));
    list.add(node);
    return list;
  }
}
