// Spots COM_QUERY (or COM_STMT_PREPARE) text that may change session state a later client would inherit on the same server
// connection: a statement starting with USE, SET, PREPARE, LOCK, CALL, HANDLER or CREATE TEMPORARY (at the
// start of the text or after a `;`), a user variable (`@x`, as in `SELECT … INTO @x`) or GET_LOCK. A few
// passes over the bytes, no allocation; a false positive (an `@` in a string) costs only a reset.

const SPACE = new Set([0x20, 0x09, 0x0a, 0x0d, 0x0c, 0x0b]);
const lower = (b: number) => (b >= 0x41 && b <= 0x5a ? b | 0x20 : b);
const isWord = (b: number | undefined) => b !== undefined && ((b | 0x20) >= 0x61 && (b | 0x20) <= 0x7a || (b >= 0x30 && b <= 0x39) || b === 0x5f || b === 0x24);

/** Skips spaces and comments from `i`; `/*!` (versioned) comments are code, so only their opening is skipped. */
function skipBlank(p: Buffer, i: number): number {
  for (;;) {
    while (i < p.length && SPACE.has(p[i]!)) i++;
    if (p[i] === 0x2f && p[i + 1] === 0x2a) {
      if (p[i + 2] === 0x21) {
        i += 3;
        while (i < p.length && p[i]! >= 0x30 && p[i]! <= 0x39) i++;
        continue;
      }
      const end = p.indexOf('*/', i + 2, 'latin1');
      if (end < 0) return p.length;
      i = end + 2;
    } else if (p[i] === 0x23 || (p[i] === 0x2d && p[i + 1] === 0x2d && (p[i + 2] === undefined || SPACE.has(p[i + 2]!)))) {
      const end = p.indexOf(0x0a, i);
      if (end < 0) return p.length;
      i = end + 1;
    } else return i;
  }
}

/** Whether the word at `i` is `word` (lower case) followed by a non-word byte. */
function wordAt(p: Buffer, i: number, word: string): boolean {
  if (i + word.length > p.length) return false;
  for (let k = 0; k < word.length; k++) if (lower(p[i + k]!) !== word.charCodeAt(k)) return false;
  return !isWord(p[i + word.length]);
}

function statementChanges(p: Buffer, i: number): boolean {
  i = skipBlank(p, i);
  if (wordAt(p, i, 'use') || wordAt(p, i, 'set') || wordAt(p, i, 'prepare') || wordAt(p, i, 'lock') || wordAt(p, i, 'call') || wordAt(p, i, 'handler')) return true;
  if (wordAt(p, i, 'create')) {
    const j = skipBlank(p, i + 6);
    return wordAt(p, j, 'temporary') || wordAt(p, j, 'or') && wordAt(p, skipBlank(p, j + 2), 'replace') && wordAt(p, skipBlank(p, skipBlank(p, j + 2) + 7), 'temporary');
  }
  return false;
}

/** A user variable: `@` not part of `@@` (system variables are covered by SET). */
function mentionsUserVariable(p: Buffer): boolean {
  for (let i = p.indexOf(0x40, 1); i >= 0; i = p.indexOf(0x40, i + 2)) {
    if (p[i + 1] !== 0x40) return true;
  }
  return false;
}

/** `payload` is a COM_QUERY packet payload (command byte first). */
export function changesSession(payload: Buffer): boolean {
  if (statementChanges(payload, 1) || mentionsUserVariable(payload)) return true;
  if (payload.indexOf('get_lock', 1, 'latin1') >= 0 || payload.indexOf('GET_LOCK', 1, 'latin1') >= 0) return true;
  for (let i = payload.indexOf(0x3b, 1); i >= 0; i = payload.indexOf(0x3b, i + 1)) {
    if (statementChanges(payload, i + 1)) return true;
  }
  return false;
}
