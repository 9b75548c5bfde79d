// The suite's one way to wait (issue 28 §1): poll for a state, never sleep a fixed time and hope. `until`
// resolves with the first truthy value the check returns and fails, naming what it waited for, when the
// state does not come within the limit (generous: the suite runs on loaded machines). `sleep` is for pacing
// (a request rate, a deliberate gap), never for "long enough for it to have happened".
import { setTimeout as sleep } from 'node:timers/promises';

export { sleep };

type Falsy = false | 0 | '' | null | undefined;

/** `what` may be a function, called on timeout, to name the state the wait ended in. */
export async function until<T>(what: string | (() => string), check: () => T | Promise<T>, ms = 20_000, everyMs = 20): Promise<Exclude<T, Falsy>> {
  const end = performance.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v as Exclude<T, Falsy>;
    if (performance.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${typeof what === 'string' ? what : what()}`);
    await sleep(everyMs);
  }
}
