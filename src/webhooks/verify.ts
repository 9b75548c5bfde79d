// Receiver helper: verifies a delivery's signature and timestamp. Exported from the package for the
// people who write webhook receivers; returns a value, never throws on bad input.
import { timingSafeEqual } from 'node:crypto';
import { HEADER_PREFIX, LEGACY_HEADER_PREFIX, SUFFIX, signDelivery } from './signature.js';

export type HeaderBag =
  | { get(name: string): string | null }
  | Record<string, string | readonly string[] | undefined>;

export type VerifyFailure =
  | 'missing_signature'
  | 'missing_timestamp'
  | 'missing_job_id'
  | 'malformed_timestamp'
  | 'stale_timestamp'
  | 'signature_mismatch';

export type VerifyResult =
  | { ok: true; jobId: string; timestamp: number; event: string | null; webhookId: string | null }
  | { ok: false; reason: VerifyFailure };

export interface VerifyOptions {
  /** Largest allowed distance between X-Service-Timestamp and the receiver's clock, in seconds (default 300). */
  toleranceSeconds?: number;
  /** The receiver's clock in Unix milliseconds (default Date.now()). */
  now?: number;
}

function header(headers: HeaderBag, suffix: string): string | null {
  for (const name of [HEADER_PREFIX + suffix, LEGACY_HEADER_PREFIX + suffix]) {
    let v: string | readonly string[] | null | undefined;
    if (typeof (headers as { get?: unknown }).get === 'function') v = (headers as { get(n: string): string | null }).get(name);
    else {
      const bag = headers as Record<string, string | readonly string[] | undefined>;
      v = bag[name];
      if (v === undefined) {
        // Plain objects may keep the sender's capitalisation.
        const key = Object.keys(bag).find((k) => k.toLowerCase() === name);
        v = key === undefined ? undefined : bag[key];
      }
    }
    const one = Array.isArray(v) ? v[0] : v;
    if (typeof one === 'string' && one !== '') return one;
  }
  return null;
}

/**
 * Checks a delivery: recomputes the HMAC over the raw body exactly as received (do not re-serialise parsed
 * JSON), compares in constant time, and rejects a timestamp further than `toleranceSeconds` from now.
 */
export function verifyDelivery(secret: string, headers: HeaderBag, rawBody: string | Uint8Array, opts: VerifyOptions = {}): VerifyResult {
  const signature = header(headers, SUFFIX.signature);
  if (!signature) return { ok: false, reason: 'missing_signature' };
  const ts = header(headers, SUFFIX.timestamp);
  if (!ts) return { ok: false, reason: 'missing_timestamp' };
  const jobId = header(headers, SUFFIX.jobId);
  if (!jobId) return { ok: false, reason: 'missing_job_id' };
  if (!/^\d{1,12}$/.test(ts)) return { ok: false, reason: 'malformed_timestamp' };
  const timestamp = Number(ts);
  const tolerance = opts.toleranceSeconds ?? 300;
  const nowSeconds = Math.floor((opts.now ?? Date.now()) / 1000);
  if (Math.abs(nowSeconds - timestamp) > tolerance) return { ok: false, reason: 'stale_timestamp' };
  const expected = Buffer.from(signDelivery(secret, ts, jobId, rawBody), 'utf8');
  const given = Buffer.from(signature.toLowerCase(), 'utf8');
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) return { ok: false, reason: 'signature_mismatch' };
  return { ok: true, jobId, timestamp, event: header(headers, SUFFIX.event), webhookId: header(headers, SUFFIX.webhookId) };
}
