// A wire client's pool and key are checked again before each transaction (PostgreSQL) or admission
// (MySQL): a revoked key, a suspended or deleted pool ends the session there. Most of the time nothing
// that check reads has changed, and on a busy listener the check was a measurable part of each
// transaction (map lookups, a clock read): this remembers when it last passed.
import type { Snapshot } from '../pool-request/snapshot.js';

export class LastCheck {
  #snapshot: Snapshot | null = null;
  #keyEdits = 0;
  #keyExpiresAt: number | null = null;

  /**
   * The last check still holds: the same snapshot object (a full reload makes a new one), no key point
   * update since (Snapshot.keyEdits), and the key's expiry not reached.
   */
  holds(snapshot: Snapshot, clock: () => number): boolean {
    return snapshot === this.#snapshot && snapshot.keyEdits === this.#keyEdits && (this.#keyExpiresAt === null || this.#keyExpiresAt > clock());
  }

  /** The check passed against `snapshot`, for a key that expires at `keyExpiresAt` (null: never, or no key). */
  passed(snapshot: Snapshot, keyExpiresAt: number | null): void {
    this.#snapshot = snapshot;
    this.#keyEdits = snapshot.keyEdits;
    this.#keyExpiresAt = keyExpiresAt;
  }
}
