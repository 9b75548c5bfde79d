// Static JWT verification keys from pool settings: a PEM public key or a JWK (public, or `oct` for HS*).
import { createPublicKey, createSecretKey, type KeyObject } from 'node:crypto';

export function importStaticKey(key: string | Record<string, unknown>): KeyObject {
  if (typeof key === 'string') return createPublicKey(key);
  if (key.kty === 'oct') {
    if (typeof key.k !== 'string' || key.k.length === 0) throw new Error('an oct JWK needs k');
    return createSecretKey(Buffer.from(key.k, 'base64url'));
  }
  // A private JWK would import as a public key too; refusing it keeps private material out of settings.
  if ('d' in key) throw new Error('a private key was given; store only the public key');
  return createPublicKey({ key: key as never, format: 'jwk' });
}
