// Encrypts secrets that must be usable again (signing secrets, credentials) with the master key: AES-256-GCM.
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const VERSION = 'v1';
const BYTES_VERSION = Buffer.from([1]);

export class SecretBox {
  readonly #key: Buffer;

  constructor(key: Buffer) {
    if (key.length !== 32) throw new Error('master key must be 32 bytes');
    this.#key = key;
  }

  seal(plaintext: string): string {
    const iv = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', this.#key, iv);
    const body = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()]);
    return [VERSION, iv.toString('base64'), cipher.getAuthTag().toString('base64'), body.toString('base64')].join(':');
  }

  /** Binary form of seal(): version byte 1, 12-byte IV, 16-byte tag, ciphertext. */
  sealBytes(plaintext: Uint8Array): Buffer {
    const iv = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', this.#key, iv);
    const body = Buffer.concat([cipher.update(plaintext), cipher.final()]);
    return Buffer.concat([BYTES_VERSION, iv, cipher.getAuthTag(), body]);
  }

  openBytes(sealed: Uint8Array): Buffer {
    const b = Buffer.from(sealed.buffer, sealed.byteOffset, sealed.byteLength);
    if (b.length < 29 || b[0] !== BYTES_VERSION[0]) throw new Error('sealed bytes have an unknown format');
    const decipher = createDecipheriv('aes-256-gcm', this.#key, b.subarray(1, 13));
    decipher.setAuthTag(b.subarray(13, 29));
    return Buffer.concat([decipher.update(b.subarray(29)), decipher.final()]);
  }

  open(sealed: string): string {
    const [version, iv, tag, body] = sealed.split(':');
    if (version !== VERSION || !iv || !tag || body === undefined) throw new Error('sealed secret has an unknown format');
    const decipher = createDecipheriv('aes-256-gcm', this.#key, Buffer.from(iv, 'base64'));
    decipher.setAuthTag(Buffer.from(tag, 'base64'));
    return Buffer.concat([decipher.update(Buffer.from(body, 'base64')), decipher.final()]).toString('utf8');
  }
}

const MAKE_ONE = 'make one with `openssl rand -hex 32` (or `node -e "console.log(crypto.randomBytes(32).toString(\'hex\'))"`)';

export function parseMasterKey(text: string): Buffer {
  const t = text.trim();
  const key = /^[0-9a-fA-F]{64}$/.test(t) ? Buffer.from(t, 'hex') : Buffer.from(t, 'base64');
  if (key.length !== 32) throw new Error(`POOLGATE_SECRET_KEY must be 32 bytes, as 64 hex digits or base64: ${MAKE_ONE}`);
  // A key typed or copied from an example (all zeros, one repeated byte, 0123…) is no secret. 32 random bytes
  // hold ~30 distinct values; fewer than 16 happens by chance with odds below 1e-20.
  if (new Set(key).size < 16) throw new Error(`POOLGATE_SECRET_KEY is a well-known or patterned key (${new Set(key).size} distinct bytes), not a secret: ${MAKE_ONE}`);
  return key;
}

/** The key a command that must not create one did not find: nothing was written. */
export class MasterKeyNotFoundError extends Error {
  override name = 'MasterKeyNotFoundError';
}

/**
 * The configured key, or the one generated into the data dir (mode 0600) on first start. create false (admin
 * commands other than bootstrap): a missing key file is refused, since a new key could open none of the store's secrets.
 */
export function loadMasterKey(secretKey: string | null, dataDir: string, opts: { create?: boolean } = {}): Buffer {
  if (secretKey) return parseMasterKey(secretKey);
  const dir = resolve(dataDir);
  const file = join(dir, 'secret.key');
  if (existsSync(file)) return parseMasterKey(readFileSync(file, 'utf8'));
  if (opts.create === false) throw new MasterKeyNotFoundError(`no master key: POOLGATE_SECRET_KEY is not set and ${file} does not exist`);
  mkdirSync(dir, { recursive: true });
  writeFileSync(file, randomBytes(32).toString('hex') + '\n', { mode: 0o600, flag: 'wx' });
  chmodSync(file, 0o600);
  return parseMasterKey(readFileSync(file, 'utf8'));
}
