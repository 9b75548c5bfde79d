// Client helper for pools with origin signing (HMAC policy): the three headers that sign one request
// with the pool key's signing secret. Send them with the pool key (X-Service-Key) and the exact body.
import { randomBytes } from 'node:crypto';
import { bodySha256, canonicalString, NONCE_HEADER, SIGNATURE_HEADER, signCanonical, TIMESTAMP_HEADER } from '../policies/hmac-canonical.js';

export interface SignRequestInput {
  /** The key's signing_secret (returned once when the key was minted). */
  secret: string;
  method: string;
  /** Path with query exactly as it goes on the request line, e.g. `/v1/items?page=2`. */
  target: string;
  /** The exact bytes sent as the body; omit (or empty) for no body. */
  body?: Uint8Array | string | null;
  /** Unix ms; defaults to now. */
  now?: number;
  /** Defaults to 32 random hex digits; must be unique within the pool's signature window. */
  nonce?: string;
}

export type SignedHeaders = Record<'x-service-timestamp' | 'x-service-nonce' | 'x-service-signature', string>;

export function signRequest(input: SignRequestInput): SignedHeaders {
  const timestamp = String(Math.floor((input.now ?? Date.now()) / 1000));
  const nonce = input.nonce ?? randomBytes(16).toString('hex');
  const canonical = canonicalString(input.method, input.target, timestamp, nonce, bodySha256(input.body ?? null));
  return {
    [TIMESTAMP_HEADER]: timestamp,
    [NONCE_HEADER]: nonce,
    [SIGNATURE_HEADER]: signCanonical(input.secret, canonical),
  } as SignedHeaders;
}

export { canonicalString as requestCanonicalString } from '../policies/hmac-canonical.js';
