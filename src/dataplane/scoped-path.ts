// The path a path-scoped key is judged on (stage 3). An origin resolves a path its own way (percent-decoding,
// `..`, `\` as `/`, Tomcat's `;` parameters, a second decode of `%25`); a prefix check on the raw bytes lets a
// key walk out of its prefix. So a scoped path is made canonical here (RFC 3986 §6.2.2: unreserved characters
// decoded, dot segments removed; slashes merged) and that canonical path is what the origin receives; a path
// whose meaning depends on the origin's decoder (escaped `/` `\` `%`, a raw `\`, `;`, a control byte) is
// refused instead. Envoy's normalize_path + merge_slashes + path_with_escaped_slashes_action=REJECT_REQUEST.
// (docs/http-front-door.md)

/** RFC 3986 §2.3 unreserved: ALPHA / DIGIT / "-" / "." / "_" / "~". */
function unreserved(c: number): boolean {
  return (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a) || (c >= 0x30 && c <= 0x39) || c === 0x2d || c === 0x2e || c === 0x5f || c === 0x7e;
}

function hexValue(c: number): number {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  if (c >= 0x41 && c <= 0x46) return c - 0x37;
  if (c >= 0x61 && c <= 0x66) return c - 0x57;
  return -1;
}

/**
 * The canonical form of an origin-form path, or null when the path cannot be judged safely: a malformed or
 * decoder-dependent escape (`%2F` `%5C` `%25` and any bad `%`), a raw `\`, `;`, `#`, or a control byte.
 * Other escapes (e.g. `%20`) are kept as sent, with upper-case hex (RFC 3986 §6.2.2.1).
 */
export function canonicalPath(path: string): string | null {
  let decoded = '';
  for (let i = 0; i < path.length; i++) {
    const c = path.charCodeAt(i);
    if (c === 0x25 /* % */) {
      const hi = hexValue(path.charCodeAt(i + 1));
      const lo = hexValue(path.charCodeAt(i + 2));
      if (hi < 0 || lo < 0) return null;
      const byte = hi * 16 + lo;
      // `/` and `\` split segments at some origins and not others; `%` invites a second decode (%252e → %2e → .).
      if (byte === 0x2f || byte === 0x5c || byte === 0x25 || byte < 0x20 || byte === 0x7f) return null;
      decoded += unreserved(byte) ? String.fromCharCode(byte) : `%${path.slice(i + 1, i + 3).toUpperCase()}`;
      i += 2;
    } else if (c === 0x5c /* \ */ || c === 0x3b /* ; */ || c === 0x23 /* # */ || c <= 0x20 || c >= 0x7f) {
      return null;
    } else {
      decoded += path[i];
    }
  }
  if (decoded.charCodeAt(0) !== 0x2f) return null;
  // Merge slashes, then remove dot segments (RFC 3986 §5.2.4 on a path that starts with `/`).
  const out: string[] = [];
  const segments = decoded.split('/');
  const last = segments.length - 1;
  for (let i = 1; i <= last; i++) {
    const s = segments[i]!;
    if (s === '..') {
      out.pop();
      if (i === last) out.push('');
    } else if (s === '.' || (s === '' && i !== last)) {
      if (i === last) out.push('');
    } else {
      out.push(s);
    }
  }
  return `/${out.join('/')}`;
}

/** `path` (canonical) lies under `prefix` on a segment boundary: `/search` admits `/search` and `/search/x`, not `/search-admin`. */
export function underPrefix(path: string, prefix: string): boolean {
  if (!path.startsWith(prefix)) return false;
  return path.length === prefix.length || prefix.endsWith('/') || path.charCodeAt(prefix.length) === 0x2f;
}
