// Spots COM_QUERY (or prepared) text that creates or drops session state: what keeps a client on its server
// connection (pinned) in statement pooling, and what marks the connection for COM_RESET_CONNECTION before
// another client gets it. Only the first keyword of each statement is read (at the start of the text and
// after each `;`), plus a search for `@` and for GET_LOCK / RELEASE_ALL_LOCKS: native byte searches, no
// allocation. A false positive pins a client (it keeps its slot) or costs a reset; never a leak.

/** Why a client is pinned: one bit each; the names are the metrics' `reason` label. */
export const PIN = {
  set: 1,
  user_variable: 2,
  temp_table: 4,
  get_lock: 8,
  lock_tables: 16,
  use_database: 32,
  prepared_statement: 64,
  handler: 128,
} as const;
export type PinReason = keyof typeof PIN;
export const PIN_REASONS = Object.keys(PIN) as PinReason[];
export const PIN_MASK = 0xff;

/** The state a statement drops (applied when it succeeds). */
export const CLEAR = {
  lock_tables: 1 << 8,
  get_lock: 1 << 9,
  /** `USE` of the pool's own database: back where every session starts. */
  use_database: 1 << 10,
} as const;
/** Changes the session in a way a later client could see, without pinning (CALL, SET GLOBAL, USE of the pool's database). */
export const DIRTY = 1 << 11;

const SPACE = new Set([0x20, 0x09, 0x0a, 0x0d, 0x0c, 0x0b]);
const lower = (b: number) => (b >= 0x41 && b <= 0x5a ? b | 0x20 : b);
const isWord = (b: number | undefined) => b !== undefined && ((b | 0x20) >= 0x61 && (b | 0x20) <= 0x7a || (b >= 0x30 && b <= 0x39) || b === 0x5f || b === 0x24);

/** Skips spaces and comments from `i`; `/*!` (versioned) comments are code, so only their opening is skipped. */
export function skipBlank(p: Buffer, i: number): number {
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
export function wordAt(p: Buffer, i: number, word: string): boolean {
  if (i + word.length > p.length) return false;
  for (let k = 0; k < word.length; k++) if (lower(p[i + k]!) !== word.charCodeAt(k)) return false;
  return !isWord(p[i + word.length]);
}

/** The word after the one of length `len` at `i`. */
const next = (p: Buffer, i: number, len: number) => skipBlank(p, i + len);

/** The identifier at `i` (backquotes removed), for `USE db`. */
function identifierAt(p: Buffer, i: number): string {
  if (p[i] === 0x60) {
    const end = p.indexOf(0x60, i + 1);
    return end < 0 ? '' : p.toString('utf8', i + 1, end);
  }
  let j = i;
  while (j < p.length && isWord(p[j])) j++;
  return p.toString('utf8', i, j);
}

/** Effects of the statement whose text starts at `i`. */
function statementEffects(p: Buffer, i: number, poolDb: string, inTransaction: boolean): number {
  i = skipBlank(p, i);
  const c = lower(p[i] ?? 0);
  // Most statements (SELECT, INSERT, UPDATE, DELETE, BEGIN, COMMIT, ...) stop at this switch.
  switch (c) {
    case 0x73: // s
      if (!wordAt(p, i, 'set')) return 0;
      return setEffects(p, next(p, i, 3), inTransaction);
    case 0x75: // u
      if (wordAt(p, i, 'use')) return identifierAt(p, next(p, i, 3)) === poolDb ? CLEAR.use_database | DIRTY : PIN.use_database;
      if (wordAt(p, i, 'unlock')) return wordAt(p, next(p, i, 6), 'tables') || wordAt(p, next(p, i, 6), 'table') ? CLEAR.lock_tables : 0;
      return 0;
    case 0x6c: // l
      return wordAt(p, i, 'lock') && (wordAt(p, next(p, i, 4), 'tables') || wordAt(p, next(p, i, 4), 'table')) ? PIN.lock_tables : 0;
    case 0x70: // p
      return wordAt(p, i, 'prepare') ? PIN.prepared_statement : 0;
    case 0x68: // h
      return wordAt(p, i, 'handler') ? PIN.handler : 0;
    case 0x63: { // c
      if (wordAt(p, i, 'call')) return DIRTY;
      if (!wordAt(p, i, 'create')) return 0;
      let j = next(p, i, 6);
      if (wordAt(p, j, 'or')) {
        j = next(p, j, 2);
        if (!wordAt(p, j, 'replace')) return 0;
        j = next(p, j, 7);
      }
      return wordAt(p, j, 'temporary') ? PIN.temp_table : 0;
    }
    default:
      return 0;
  }
}

/**
 * SET: session variables (and SET NAMES, SET CHARACTER SET, SET SESSION TRANSACTION) pin; a SET of
 * user variables pins for them; `SET STATEMENT … FOR` lasts one statement; `SET GLOBAL` changes no
 * session; `SET TRANSACTION` (the next transaction only) pins outside a transaction and not inside one.
 */
function setEffects(p: Buffer, j: number, inTransaction: boolean): number {
  if (wordAt(p, j, 'statement')) return 0;
  if (wordAt(p, j, 'global') || (p[j] === 0x40 && p[j + 1] === 0x40 && wordAt(p, j + 2, 'global'))) return DIRTY;
  if (wordAt(p, j, 'transaction')) return inTransaction ? 0 : PIN.set;
  // autocommit is followed through the server status flags (a client with it off keeps its connection).
  if ((wordAt(p, j, 'autocommit') || (p[j] === 0x40 && p[j + 1] === 0x40 && wordAt(p, j + 2, 'autocommit'))) && p.indexOf(0x2c, j) < 0) return DIRTY;
  if (p[j] === 0x40 && p[j + 1] !== 0x40) {
    // SET @a = 1[, @@session.x = 2]: a system variable further on pins as `set` too.
    return PIN.user_variable | (p.indexOf('@@', j, 'latin1') >= 0 || hasBareAssignment(p, j) ? PIN.set : 0);
  }
  return PIN.set;
}

/** `SET @a = 1, sql_mode = ''`: an assignment after a comma that is not a user variable. */
function hasBareAssignment(p: Buffer, j: number): boolean {
  for (let k = p.indexOf(0x2c, j); k >= 0; k = p.indexOf(0x2c, k + 1)) {
    const n = skipBlank(p, k + 1);
    if (p[n] !== 0x40 && isWord(p[n])) return true;
  }
  return false;
}

/**
 * A user variable assigned outside SET: `SELECT … INTO @x`, `@x := …`, or a CALL's OUT argument. A user
 * variable only read (`SELECT @x`) creates nothing.
 */
function assignsUserVariable(p: Buffer, start: number): boolean {
  let any = false;
  for (let i = p.indexOf(0x40, start); i >= 0; i = p.indexOf(0x40, i + 2)) {
    if (p[i + 1] === 0x40) continue;
    any = true;
    break;
  }
  if (!any) return false;
  if (p.indexOf(NEEDLE.assign, start) >= 0) return true;
  for (let i = p.indexOf(0x40, start); i >= 0; i = p.indexOf(0x40, i + 1)) {
    if (p[i + 1] === 0x40) {
      i++;
      continue;
    }
    // Walk back over spaces and earlier `@var,` items to the word before: INTO, or a CALL argument list.
    let k = i - 1;
    for (;;) {
      while (k >= start && SPACE.has(p[k]!)) k--;
      if (p[k] === 0x2c) {
        k--;
        while (k >= start && SPACE.has(p[k]!)) k--;
        while (k >= start && (isWord(p[k]) || p[k] === 0x40 || p[k] === 0x60)) k--;
        continue;
      }
      break;
    }
    if (p[k] === 0x28) return true; // CALL p(@out): conservative for any function call taking a variable
    if (k >= start + 3 && wordAt(p, k - 3, 'into') && !isWord(p[k - 4])) return true;
  }
  return false;
}

const NEEDLE = {
  lock: Buffer.from('_lock'),
  LOCK: Buffer.from('_LOCK'),
  Lock: Buffer.from('_Lock'),
  assign: Buffer.from(':='),
};

/**
 * Effects of a COM_QUERY (or COM_STMT_PREPARE) payload, command byte first: PIN, CLEAR and DIRTY bits.
 * `poolDb` is the pool's database; `inTransaction` whether the client is inside one.
 */
export function sessionEffects(payload: Buffer, poolDb: string, inTransaction: boolean): number {
  let e = statementEffects(payload, 1, poolDb, inTransaction);
  for (let i = payload.indexOf(0x3b, 1); i >= 0; i = payload.indexOf(0x3b, i + 1)) e |= statementEffects(payload, i + 1, poolDb, inTransaction);
  if ((e & PIN.user_variable) === 0 && payload.indexOf(0x40, 1) >= 0 && assignsUserVariable(payload, 1)) e |= PIN.user_variable;
  // GET_LOCK and RELEASE_ALL_LOCKS share `_lock`: one search in the usual case (none).
  if (payload.indexOf(NEEDLE.lock, 1) >= 0 || payload.indexOf(NEEDLE.LOCK, 1) >= 0 || payload.indexOf(NEEDLE.Lock, 1) >= 0) e |= lockCalls(payload);
  return e;
}

function lockCalls(p: Buffer): number {
  const t = p.toString('latin1', 1).toLowerCase();
  return (t.includes('get_lock') ? PIN.get_lock : 0) | (t.includes('release_all_locks') ? CLEAR.get_lock : 0);
}
