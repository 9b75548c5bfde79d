// Automatic pinning (transaction mode): which statements create session state that must stay with the client
// (so the client keeps its server connection until the state is gone), and which ones reliably remove it.
// Only the first keyword is read on the common path (after white space and comments), byte by byte, with no
// string made: a statement whose first keyword cannot start one of these costs a few byte compares. SELECT and
// WITH can call the session functions (advisory locks, set_config, SELECT INTO TEMP), so their text is
// searched, and only when it holds a '(' or an INTO.
import { reported, trackedName } from './session-params.js';

/** Kinds of session state, one bit each (a client may hold several). */
export const PIN = {
  set: 1,
  temp_table: 2,
  listen: 4,
  advisory_lock: 8,
  prepared_statement: 16,
  cursor_with_hold: 32,
} as const;
export type PinReason = keyof typeof PIN;
export const PIN_REASONS = Object.keys(PIN) as PinReason[];
export const ALL_PINS = 63;

/** What a statement does to session state: the kinds it may create, and those it removes when it succeeds. */
export interface Effect {
  pins: number;
  clears: number;
  /** It removes the connection's prepared statements (DISCARD ALL, DEALLOCATE ALL): poolgate's renamed ones too. */
  dropsPrepared: boolean;
  /** It resets every setting (DISCARD ALL, RESET ALL): unreported tracked parameters are back at their login values. */
  resetsSettings: boolean;
}

export const NONE: Effect = Object.freeze({ pins: 0, clears: 0, dropsPrepared: false, resetsSettings: false });
const pin = (pins: number): Effect => ({ pins, clears: 0, dropsPrepared: false, resetsSettings: false });

/** Index of the first byte after white space and comments (-- line, nested block comments), from `at`. */
function skipBlank(b: Buffer, at: number, end: number): number {
  while (at < end) {
    const c = b[at]!;
    if (c === 0x20 || (c >= 0x09 && c <= 0x0d)) at++;
    else if (c === 0x2d /* - */ && b[at + 1] === 0x2d) {
      while (at < end && b[at] !== 0x0a) at++;
    } else if (c === 0x2f /* / */ && b[at + 1] === 0x2a /* * */) {
      let depth = 1;
      at += 2;
      while (at < end && depth > 0) {
        if (b[at] === 0x2a && b[at + 1] === 0x2f) (depth--, (at += 2));
        else if (b[at] === 0x2f && b[at + 1] === 0x2a) (depth++, (at += 2));
        else at++;
      }
    } else if (c === 0x28 /* ( */) at++; // `(SELECT …)` and the like start with the same keyword.
    else return at;
  }
  return at;
}

const isWordByte = (c: number | undefined) => c !== undefined && ((c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a) || (c >= 0x30 && c <= 0x39) || c === 0x5f);

/** Whether the keyword `w` (lower case) is at `at`, as a whole word, case-insensitively. */
function word(b: Buffer, at: number, end: number, w: string): boolean {
  if (end - at < w.length) return false;
  for (let i = 0; i < w.length; i++) if ((b[at + i]! | 0x20) !== w.charCodeAt(i)) return false;
  return !isWordByte(b[at + w.length]);
}

/** The next word at `at` (after blanks): its start; -1 at the end. */
function next(b: Buffer, at: number, end: number): number {
  const i = skipBlank(b, at, end);
  return i < end ? i : -1;
}

const ADVISORY_LOCK = /\bpg_(?:try_)?advisory_lock(?:_shared)?\s*\(/i;
const ADVISORY_UNLOCK_ALL = /\bpg_advisory_unlock_all\s*\(/i;
const SET_CONFIG = /\bset_config\s*\(/i;
const SET_CONFIG_LOCAL = /\bset_config\s*\((?:[^()]|\([^()]*\))*,\s*true\s*\)/i;
const INTO_TEMP = /\binto\s+(?:temp|temporary)\b/i;
const WITH_HOLD = /\bwith\s+hold\b/i;
/** SELECT / WITH: the session functions they may call. */
function selectEffect(b: Buffer, at: number, end: number): Effect {
  // One pass over the bytes: only a function call ('(') or an INTO can matter.
  let hasParen = false;
  let hasInto = false;
  for (let k = at; k < end; k++) {
    const c = b[k]!;
    if (c === 0x28) {
      hasParen = true;
      break;
    }
    if ((c | 0x20) === 0x69 /* i */ && (b[k + 1]! | 0x20) === 0x6e && (b[k + 2]! | 0x20) === 0x74 && (b[k + 3]! | 0x20) === 0x6f) hasInto = true;
  }
  if (!hasParen && !hasInto) return NONE;
  const text = b.toString('latin1', at, end);
  let pins = 0;
  let clears = 0;
  if (hasParen) {
    if (ADVISORY_LOCK.test(text)) pins |= PIN.advisory_lock;
    else if (ADVISORY_UNLOCK_ALL.test(text)) clears |= PIN.advisory_lock;
    if (SET_CONFIG.test(text) && !SET_CONFIG_LOCAL.test(text)) pins |= PIN.set;
  }
  if (INTO_TEMP.test(text)) pins |= PIN.temp_table;
  return pins === 0 && clears === 0 ? NONE : { pins, clears, dropsPrepared: false, resetsSettings: false };
}

/**
 * Whether the rest of a SELECT, from `at`, is one statement that can call nothing: no '(' nor INTO, and no
 * ';' but a trailing one. false sends it to the full check (queryEffect), as selectEffect reads it.
 */
function plainSelect(b: Buffer, at: number, end: number): boolean {
  for (let k = at; k < end; k++) {
    const c = b[k]!;
    if (c === 0x28 /* ( */) return false;
    if (c === 0x3b /* ; */) return skipBlank(b, k + 1, end) >= end;
    if ((c | 0x20) === 0x69 /* i */ && (b[k + 1]! | 0x20) === 0x6e && (b[k + 2]! | 0x20) === 0x74 && (b[k + 3]! | 0x20) === 0x6f) return false;
  }
  return true;
}

/** SET …: session state unless LOCAL, a transaction's characteristics, constraints, or a parameter poolgate tracks itself. */
function setEffect(b: Buffer, at: number, end: number): Effect {
  let i = next(b, at, end);
  if (i < 0) return NONE;
  if (word(b, i, end, 'local') || word(b, i, end, 'transaction') || word(b, i, end, 'constraints')) return NONE;
  if (word(b, i, end, 'session')) {
    i = next(b, i + 7, end);
    if (i < 0) return NONE;
  }
  if (word(b, i, end, 'time')) return NONE; // SET TIME ZONE: TimeZone, tracked and reported.
  // The parameter's name (a quoted one is never a tracked name's spelling that matters here: pin).
  let j = i;
  while (j < end && (isWordByte(b[j]) || b[j] === 0x2e /* . */)) j++;
  const name = trackedName(b.toString('latin1', i, j));
  // A tracked parameter the server reports follows the client by its ParameterStatus (session-params.ts).
  if (name && reported(name)) return NONE;
  return pin(PIN.set);
}

/**
 * What one statement, starting at `at` (the text of a Query or a Parse), does to session state; NONE for
 * almost everything. Conservative: where it cannot tell, it pins; it clears only what a statement removes
 * for certain when it succeeds.
 */
export function statementEffect(b: Buffer, at: number, end: number): Effect {
  const i = skipBlank(b, at, end);
  if (i >= end) return NONE;
  switch (b[i]! | 0x20) {
    case 0x73 /* s */:
      if (word(b, i, end, 'select')) return selectEffect(b, i + 6, end);
      if (word(b, i, end, 'set')) return setEffect(b, i + 3, end);
      return NONE;
    case 0x77 /* w */:
      return word(b, i, end, 'with') ? selectEffect(b, i + 4, end) : NONE;
    case 0x63 /* c */: {
      if (word(b, i, end, 'create')) {
        let k = next(b, i + 6, end);
        if (k >= 0 && word(b, k, end, 'or')) k = next(b, k + 2, end); // OR REPLACE
        if (k >= 0 && word(b, k, end, 'replace')) k = next(b, k + 7, end);
        if (k >= 0 && (word(b, k, end, 'global') || word(b, k, end, 'local'))) k = next(b, k + 6, end);
        if (k >= 0 && (word(b, k, end, 'temp') || word(b, k, end, 'temporary'))) return pin(PIN.temp_table);
        // CREATE TABLE pg_temp.x makes a temporary table too.
        if (b.toString('latin1', i, Math.min(end, i + 256)).toLowerCase().includes('pg_temp.')) return pin(PIN.temp_table);
        return NONE;
      }
      if (word(b, i, end, 'close')) {
        const k = next(b, i + 5, end);
        return k >= 0 && word(b, k, end, 'all') ? { pins: 0, clears: PIN.cursor_with_hold, dropsPrepared: false, resetsSettings: false } : NONE;
      }
      return NONE;
    }
    case 0x6c /* l */:
      return word(b, i, end, 'listen') ? pin(PIN.listen) : NONE;
    case 0x75 /* u */: {
      if (!word(b, i, end, 'unlisten')) return NONE;
      const k = next(b, i + 8, end);
      return k >= 0 && b[k] === 0x2a /* * */ ? { pins: 0, clears: PIN.listen, dropsPrepared: false, resetsSettings: false } : NONE;
    }
    case 0x70 /* p */: {
      if (!word(b, i, end, 'prepare')) return NONE;
      const k = next(b, i + 7, end);
      // PREPARE TRANSACTION is two-phase commit, not a statement.
      return k >= 0 && word(b, k, end, 'transaction') ? NONE : pin(PIN.prepared_statement);
    }
    case 0x64 /* d */: {
      if (word(b, i, end, 'declare')) return WITH_HOLD.test(b.toString('latin1', i, end)) ? pin(PIN.cursor_with_hold) : NONE;
      if (word(b, i, end, 'discard')) {
        const k = next(b, i + 7, end);
        if (k < 0) return NONE;
        if (word(b, k, end, 'all')) return { pins: 0, clears: ALL_PINS, dropsPrepared: true, resetsSettings: true };
        if (word(b, k, end, 'temp') || word(b, k, end, 'temporary')) return { pins: 0, clears: PIN.temp_table, dropsPrepared: false, resetsSettings: false };
        return NONE;
      }
      if (word(b, i, end, 'deallocate')) {
        let k = next(b, i + 10, end);
        if (k >= 0 && word(b, k, end, 'prepare')) k = next(b, k + 7, end);
        return k >= 0 && word(b, k, end, 'all') ? { pins: 0, clears: PIN.prepared_statement, dropsPrepared: true, resetsSettings: false } : NONE;
      }
      return NONE;
    }
    case 0x72 /* r */: {
      if (!word(b, i, end, 'reset')) return NONE;
      const k = next(b, i + 5, end);
      return k >= 0 && word(b, k, end, 'all') ? { pins: 0, clears: PIN.set, dropsPrepared: false, resetsSettings: true } : NONE;
    }
    default:
      return NONE;
  }
}

/**
 * The effect of a simple Query's text (from `at`), over each of its statements: a ';' starts the next one (a
 * ';' inside a literal only makes a needless check, which may pin: never a miss). The one-statement case,
 * by far the commonest, allocates nothing.
 */
export function queryEffect(b: Buffer, at: number, end: number): Effect {
  // A lone SELECT with no call nor INTO (pgbench -S, most reads): one byte scan settles it, ';' included,
  // without indexOf's call into C++ (≈ 110 ns, as much as the whole scan of a short query).
  const i = skipBlank(b, at, end);
  if (i < end && (b[i]! | 0x20) === 0x73 /* s */ && word(b, i, end, 'select') && plainSelect(b, i + 6, end)) return NONE;
  let semi = b.indexOf(0x3b /* ; */, at);
  if (semi < 0 || semi >= end || skipBlank(b, semi + 1, end) >= end) return statementEffect(b, at, end);
  let pins = 0;
  let start = at;
  for (;;) {
    const stop = semi < 0 || semi >= end ? end : semi;
    pins |= statementEffect(b, start, stop).pins;
    if (stop === end) break;
    start = stop + 1;
    semi = b.indexOf(0x3b, start);
  }
  // Several statements: what they create counts; nothing is cleared (an error in a later one rolls back the earlier).
  return pins === 0 ? NONE : pin(pins);
}
