// A granted slot as the caller holds it: released once (the first release counts), back to whatever gave it.
import type { Outcome, Permit } from './governor.js';

/** What hands out and takes back a pool's slots (a pool of the memory governor, a pool view of the shared one). */
export interface SlotGiver {
  readonly poolId: number;
  give(grantedAt: number, outcome: Outcome | undefined): void;
}

export class SlotPermit implements Permit {
  readonly poolId: number;
  readonly #pool: SlotGiver;
  readonly #grantedAt: number;
  #released = false;

  constructor(pool: SlotGiver, grantedAt: number) {
    this.#pool = pool;
    this.poolId = pool.poolId;
    this.#grantedAt = grantedAt;
  }

  release(outcome?: Outcome): void {
    if (this.#released) return;
    this.#released = true;
    this.#pool.give(this.#grantedAt, outcome);
  }
}
