// Password scrambles: what the upstream login sends (mysql_native_password, caching_sha2_password) and
// the check of a client's caching_sha2_password answer against a pool key known only by its SHA-256.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';

const sha1 = (...parts: Buffer[]): Buffer => {
  const h = createHash('sha1');
  for (const p of parts) h.update(p);
  return h.digest();
};
const sha256 = (...parts: Buffer[]): Buffer => {
  const h = createHash('sha256');
  for (const p of parts) h.update(p);
  return h.digest();
};

function xor(a: Buffer, b: Buffer): Buffer {
  const out = Buffer.allocUnsafe(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i]! ^ b[i]!;
  return out;
}

/** SHA1(pw) XOR SHA1(nonce || SHA1(SHA1(pw))). */
export function nativeScramble(password: string, nonce: Buffer): Buffer {
  if (password === '') return Buffer.alloc(0);
  const h1 = sha1(Buffer.from(password, 'utf8'));
  return xor(h1, sha1(nonce, sha1(h1)));
}

/** SHA256(pw) XOR SHA256(SHA256(SHA256(pw)) || nonce). */
export function sha2Scramble(password: string, nonce: Buffer): Buffer {
  if (password === '') return Buffer.alloc(0);
  const h1 = sha256(Buffer.from(password, 'utf8'));
  return xor(h1, sha256(sha256(h1), nonce));
}

/** A 20-byte nonce of printable-safe bytes (1..127, no '$'), as servers make them: some clients read it as a C string. */
export function makeNonce(): Buffer {
  const b = randomBytes(20);
  for (let i = 0; i < 20; i++) {
    let c = b[i]! & 0x7f;
    if (c === 0 || c === 0x24) c = 0x41 + (i % 26);
    b[i] = c;
  }
  return b;
}

/** SHA256(SHA256(key)) of each stored key hash, computed once per snapshot entry. */
const doubleHashes = new WeakMap<object, Buffer>();

/**
 * Whether `scramble` is a caching_sha2_password answer to `nonce` for the key whose SHA-256 (hex) is
 * `keyHash`: recover SHA256(key) = scramble XOR SHA256(SHA256(SHA256(key)) || nonce) and compare.
 */
export function scrambleMatches(scramble: Buffer, nonce: Buffer, keyHash: string, entry: object): boolean {
  if (scramble.length !== 32) return false;
  const h1 = Buffer.from(keyHash, 'hex');
  let h2 = doubleHashes.get(entry);
  if (!h2) {
    h2 = sha256(h1);
    doubleHashes.set(entry, h2);
  }
  return timingSafeEqual(xor(scramble, sha256(h2, nonce)), h1);
}
