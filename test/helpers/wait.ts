// Polls a condition until it holds (tests on a loaded machine wait for a state, never for a fixed time).
import { setTimeout as sleep } from 'node:timers/promises';

export async function waitFor(cond: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}
