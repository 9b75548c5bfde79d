// Keeps the hidden class (map) of Node's `process.nextTick` tick object alive for the life of the isolate, so that a
// major collection cannot turn nextTick's property stores megamorphic (docs/runtime.md, "The nextTick tick object").
//
// Why: nextTick builds each tick as a literal with two computed symbol keys. V8 records the object's map in that
// literal's feedback, weakly. When a mark-compact runs while no tick object is alive (between turns, or on an idle
// process), the map dies, the feedback is cleared, and the next tick, built on a fresh map, turns it megamorphic for
// good: from then on every optimised tier (TurboFan included) calls the runtime for each key, ~1,300 instructions a
// key, three keys a tick, ~12 ticks a proxied request. One tick object held here keeps its map, and with it the
// literal's feedback, alive.
import { createHook } from 'node:async_hooks';

/** The tick object held (null until holdTickShape has run in this isolate). */
let held: object | null = null;

/**
 * Captures one tick object through an async_hooks init hook enabled around a single nextTick, then disables the hook.
 * Call once per isolate (main thread and each worker), at start-up, before traffic: the feedback must not have gone
 * megamorphic already. Idempotent.
 */
export function holdTickShape(): void {
  if (held !== null) return;
  const hook = createHook({
    init(_id, type, _trigger, resource) {
      if (type === 'TickObject' && held === null) held = resource as object;
    },
  });
  hook.enable();
  try {
    process.nextTick(noop);
  } finally {
    hook.disable();
  }
}

/** The held tick object, for the test that proves fresh ticks still share its map after collections. */
export const heldTickObject = (): object | null => held;

function noop(): void {}
