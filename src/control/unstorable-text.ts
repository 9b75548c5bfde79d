// Text the store cannot hold: PostgreSQL text refuses NUL, and UTF-8 cannot encode an unpaired surrogate
// (it would be silently replaced). Request text with either is refused before it reaches a query.

const UNSTORABLE = /\u0000|\p{Cs}/u;

/** True when any string (key or value) anywhere in a parsed request part is unstorable. Iterative: bodies may nest deeply. */
export function hasUnstorableText(value: unknown): boolean {
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const v = stack.pop();
    if (typeof v === 'string') {
      if (UNSTORABLE.test(v)) return true;
    } else if (v !== null && typeof v === 'object') {
      for (const [k, x] of Object.entries(v)) {
        if (UNSTORABLE.test(k)) return true;
        stack.push(x);
      }
    }
  }
  return false;
}
