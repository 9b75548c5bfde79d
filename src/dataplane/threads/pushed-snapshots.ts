// A worker thread's snapshot: the copy the main thread sent at start, replaced by each full snapshot it
// pushes and patched by each batch of key point updates (mint, revoke), in the order they were sent.
import type { KeyChange, KeyEntry, Snapshot, SnapshotFeed } from '../../pool-request/snapshot.js';

export class PushedSnapshots implements SnapshotFeed {
  current: Snapshot;
  /** Set by the data plane (it syncs its database connections on each full snapshot). */
  onLoad: (snapshot: Snapshot) => void = () => {};

  constructor(first: Snapshot) {
    this.current = first;
  }

  start(): Promise<void> {
    this.onLoad(this.current);
    return Promise.resolve();
  }

  loaded(snapshot: Snapshot): void {
    this.onLoad(snapshot);
    this.current = snapshot;
  }

  keys(changes: readonly KeyChange[]): void {
    // The map belongs to this thread's copy: patching it in place is what the main thread did to its own.
    const keys = this.current.keys as Map<string, KeyEntry>;
    for (const [hash, entry] of changes) {
      if (entry === null) keys.delete(hash);
      else keys.set(hash, entry);
    }
    if (changes.length > 0) this.current.keyEdits++;
  }

  /** Reloads are the main thread's (it holds the store); what it loads arrives here by itself. */
  reload(): Promise<void> {
    return Promise.resolve();
  }

  close(): Promise<void> {
    return Promise.resolve();
  }
}
