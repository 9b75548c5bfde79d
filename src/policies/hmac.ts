// HMAC policy (pool setting originSigning): every request is signed with its pool key's signing secret
// over the canonical string (hmac-canonical.ts). The signature is compared in constant time, the
// timestamp must be within the window, and a nonce is admitted once within it (nonce replay → 401).
import { timingSafeEqual } from 'node:crypto';
import { bodySha256, canonicalString, NONCE_HEADER, NONCE_PATTERN, SIGNATURE_HEADER, signCanonical, TIMESTAMP_HEADER } from './hmac-canonical.js';
import type { NonceClaim, NonceStore } from './nonce-store.js';
import { refuse, type Policy, type PolicyRefusal, type PolicyRequest, type Verdict } from './policy.js';

const NO_KEY = refuse(401, 'hmac', 'no_key', 'signed requests need a pool key (X-Service-Key)');
const NO_SECRET = refuse(401, 'hmac', 'no_secret', 'this pool key has no signing secret; mint a new key');
const MISSING = refuse(401, 'hmac', 'missing_signature', 'X-Service-Timestamp, X-Service-Nonce and X-Service-Signature are required');
const BAD_NONCE = refuse(401, 'hmac', 'bad_nonce', 'X-Service-Nonce must be 16 to 128 characters of A-Z a-z 0-9 _ -');
const STALE = refuse(401, 'hmac', 'stale_timestamp', 'X-Service-Timestamp is outside the accepted window');
const BAD_SIGNATURE = refuse(401, 'hmac', 'bad_signature', 'the request signature does not match');
const REPLAY = refuse(401, 'hmac', 'nonce_replay', 'nonce replay');
const NONCES_FULL = refuse(503, 'hmac', 'nonce_store_full', 'too many signed requests in the window; retry shortly');
const NONCES_DOWN = refuse(503, 'hmac', 'nonce_store_unavailable', 'the replay check is unavailable; retry shortly');

const DIGITS = /^\d{1,12}$/;
const HEX64 = /^[0-9a-fA-F]{64}$/;

function afterClaim(c: NonceClaim): Verdict {
  return c === 'fresh' ? null : c === 'seen' ? REPLAY : NONCES_FULL;
}

export function hmacPolicy(opts: { windowSec: number; nonces: NonceStore; clock: () => number }): Policy {
  const windowMs = opts.windowSec * 1000;
  return {
    name: 'hmac',
    check(req: PolicyRequest, body: Buffer | null): Verdict | Promise<Verdict> {
      const key = req.key;
      if (key === null) return NO_KEY;
      if (key.signingSecret === null) return NO_SECRET;
      const ts = req.headers[TIMESTAMP_HEADER];
      const nonce = req.headers[NONCE_HEADER];
      const sig = req.headers[SIGNATURE_HEADER];
      if (ts === undefined || nonce === undefined || sig === undefined) return MISSING;
      if (!NONCE_PATTERN.test(nonce)) return BAD_NONCE;
      if (!DIGITS.test(ts)) return STALE;
      const now = opts.clock();
      const tsMs = Number(ts) * 1000;
      if (Math.abs(now - tsMs) > windowMs) return STALE;
      if (!HEX64.test(sig)) return BAD_SIGNATURE;
      const target = req.query === '' ? req.path : `${req.path}?${req.query}`;
      const expected = signCanonical(key.signingSecret, canonicalString(req.method, target, ts, nonce, bodySha256(body)));
      if (!timingSafeEqual(Buffer.from(expected, 'hex'), Buffer.from(sig, 'hex'))) return BAD_SIGNATURE;
      // Only a correctly signed request spends its nonce, so nobody else can burn a caller's nonces.
      // It must be remembered until its timestamp leaves the window (a second or more, for rounding).
      const ttlMs = Math.max(1000, tsMs + windowMs - now + 1000);
      let claim: NonceClaim | Promise<NonceClaim>;
      try {
        claim = opts.nonces.claim(`${req.pool.id}:${key.id}:${nonce}`, ttlMs);
      } catch {
        return NONCES_DOWN;
      }
      return claim instanceof Promise ? claim.then(afterClaim, (): PolicyRefusal => NONCES_DOWN) : afterClaim(claim);
    },
  };
}
