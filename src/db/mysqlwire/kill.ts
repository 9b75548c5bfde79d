// KILL from a client. The ids a client knows are the ones in poolgate's greetings, never a server thread id:
// a KILL must be mapped to the session that got that id (and from there to the server connection its
// statement runs on), and one that cannot be mapped must never reach the server, where the number names
// some other session (another client's, or with a privileged role any thread on the server).
import { skipBlank, wordAt } from './session-state.js';

export type KillRequest =
  /** `KILL [HARD|SOFT] [CONNECTION|QUERY] <id>`, or COM_PROCESS_KILL; id null: `CONNECTION_ID()`, the session itself. */
  | { kind: 'query' | 'connection'; id: number | null }
  /** A KILL poolgate cannot map (KILL USER, KILL QUERY ID, one among several statements, or in PREPARE / EXECUTE IMMEDIATE). */
  | { kind: 'unmapped' };

const MAX_ID = 0xffffffff;
/** `CONNECTION_ID()` as the whole rest of a KILL (the connectors' pool tests kill their own connection so). */
const SELF = /^connection_id\s*\(\s*\)\s*;?\s*$/i;

/** A COM_QUERY / COM_STMT_PREPARE payload (command byte first) that is or carries a KILL; null when none does. */
export function killRequest(p: Buffer): KillRequest | null {
  let i = skipBlank(p, 1);
  if (wordAt(p, i, 'kill')) {
    i = skipBlank(p, i + 4);
    if (wordAt(p, i, 'hard')) i = skipBlank(p, i + 4);
    else if (wordAt(p, i, 'soft')) i = skipBlank(p, i + 4);
    let kind: 'query' | 'connection' = 'connection';
    if (wordAt(p, i, 'connection')) i = skipBlank(p, i + 10);
    else if (wordAt(p, i, 'query')) {
      kind = 'query';
      i = skipBlank(p, i + 5);
    }
    if (SELF.test(p.toString('latin1', i))) return { kind, id: null };
    const start = i;
    while (i < p.length && p[i]! >= 0x30 && p[i]! <= 0x39) i++;
    if (i === start || i - start > 10) return { kind: 'unmapped' };
    const id = Number(p.toString('latin1', start, i));
    i = skipBlank(p, i);
    if (p[i] === 0x3b) i = skipBlank(p, i + 1);
    if (i < p.length || id > MAX_ID) return { kind: 'unmapped' };
    return { kind, id };
  }
  // KILL after a `;`, or as the text of PREPARE / EXECUTE IMMEDIATE: a cheap word search first.
  if (!mentionsKill(p)) return null;
  for (let k = p.indexOf(0x3b, 1); k >= 0; k = p.indexOf(0x3b, k + 1)) if (wordAt(p, skipBlank(p, k + 1), 'kill')) return { kind: 'unmapped' };
  if (wordAt(p, i, 'prepare') || wordAt(p, i, 'execute')) return { kind: 'unmapped' };
  return null;
}

/** The word `kill` anywhere in the text, in any case. */
function mentionsKill(p: Buffer): boolean {
  const t = p.toString('latin1', 1).toLowerCase();
  for (let at = t.indexOf('kill'); at >= 0; at = t.indexOf('kill', at + 4)) {
    const before = t.charCodeAt(at - 1);
    const after = t.charCodeAt(at + 4);
    if (!isWordChar(before) && !isWordChar(after)) return true;
  }
  return false;
}

const isWordChar = (c: number) => (c >= 0x61 && c <= 0x7a) || (c >= 0x30 && c <= 0x39) || c === 0x5f || c === 0x24;

/** COM_PROCESS_KILL: the 4-byte id after the command byte; null when malformed. */
export function processKill(p: Buffer): KillRequest | null {
  return p.length === 5 ? { kind: 'connection', id: p.readUInt32LE(1) } : null;
}
