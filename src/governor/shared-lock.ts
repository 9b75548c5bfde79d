// A mutex in shared memory (one Int32 word) for the shared-memory governor: every thread takes it around
// each short, allocation-free step on the shared counts and queues.

/** Tries this often before sleeping: the lock is held for a few hundred nanoseconds at a time. */
const SPINS = 64;

const FREE = 0;
const HELD = 1;
/** Held, and someone may be sleeping on it: the release must wake one sleeper. */
const CONTENDED = 2;

/**
 * Takes the lock at `words[i]` (the three-state futex mutex of Drepper's "Futexes Are Tricky"): a
 * compare-and-swap when free, a short spin, then Atomics.wait until the holder hands it over. Node lets
 * the main thread block in Atomics.wait too; it only ever waits for another thread's few-step section.
 */
export function lockWord(words: Int32Array, i: number): void {
  let c = Atomics.compareExchange(words, i, FREE, HELD);
  if (c === FREE) return;
  for (let n = 0; n < SPINS; n++) {
    if (Atomics.load(words, i) === FREE) {
      c = Atomics.compareExchange(words, i, FREE, HELD);
      if (c === FREE) return;
    }
  }
  if (c !== CONTENDED) c = Atomics.exchange(words, i, CONTENDED);
  while (c !== FREE) {
    Atomics.wait(words, i, CONTENDED);
    c = Atomics.exchange(words, i, CONTENDED);
  }
}

export function unlockWord(words: Int32Array, i: number): void {
  if (Atomics.sub(words, i, 1) !== HELD) {
    Atomics.store(words, i, FREE);
    Atomics.notify(words, i, 1);
  }
}
