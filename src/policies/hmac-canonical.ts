// The HMAC request signature shared by the verifier (HMAC policy) and the client signer: the canonical
// string, its headers and the signature over it.
import { createHash, createHmac } from 'node:crypto';

export const TIMESTAMP_HEADER = 'x-service-timestamp';
export const NONCE_HEADER = 'x-service-nonce';
export const SIGNATURE_HEADER = 'x-service-signature';

/** 16–128 characters of [A-Za-z0-9_-] (e.g. 32 hex digits, or a UUID without braces). */
export const NONCE_PATTERN = /^[A-Za-z0-9_-]{16,128}$/;

export const EMPTY_BODY_SHA256 = createHash('sha256').update('').digest('hex');

/**
 * Five lines joined by "\n", no trailing newline:
 *   METHOD (upper case)
 *   path with query, exactly as sent on the request line (e.g. `/v1/items?b=2&a=1`)
 *   timestamp (Unix seconds, decimal)
 *   nonce
 *   lowercase hex SHA-256 of the raw body (of the empty string when there is no body)
 */
export function canonicalString(method: string, target: string, timestamp: string, nonce: string, bodySha256Hex: string): string {
  return `${method.toUpperCase()}\n${target}\n${timestamp}\n${nonce}\n${bodySha256Hex}`;
}

/** Lowercase hex HMAC-SHA256 of the canonical string keyed with the key's signing secret. */
export function signCanonical(secret: string, canonical: string): string {
  return createHmac('sha256', secret).update(canonical).digest('hex');
}

export function bodySha256(body: Uint8Array | string | null | undefined): string {
  if (body === null || body === undefined || body.length === 0) return EMPTY_BODY_SHA256;
  return createHash('sha256').update(body).digest('hex');
}
