// Delivery signatures (spec: Canonical string): hex HMAC-SHA256, keyed with the destination's signing
// secret, over `timestamp \n job id \n sha256hex(raw body)`. Shared by the deliverer and verifyDelivery.
import { createHash, createHmac } from 'node:crypto';

/** Lower-case hex SHA-256 of the raw body bytes (a string is taken as UTF-8). */
export function bodySha256(body: string | Uint8Array): string {
  return createHash('sha256').update(body).digest('hex');
}

export function canonicalString(timestamp: number | string, jobId: string, bodySha256Hex: string): string {
  return `${timestamp}\n${jobId}\n${bodySha256Hex}`;
}

/**
 * The X-Service-Signature value. Pass the body's SHA-256 (hex) when it is already known, so a large body
 * is hashed once (at enqueue) rather than at every attempt.
 */
export function signDelivery(secret: string, timestamp: number | string, jobId: string, body: { sha256: string } | string | Uint8Array): string {
  const digest = typeof body === 'object' && 'sha256' in body ? body.sha256 : bodySha256(body);
  return createHmac('sha256', secret).update(canonicalString(timestamp, jobId, digest)).digest('hex');
}

/** Header suffixes; each is sent under both prefixes with the same value (spec: Versioning 4). */
export const HEADER_PREFIX = 'x-service-';
/** The older prefix (the product's own name), kept for receivers written against it. */
export const LEGACY_HEADER_PREFIX = 'x-poolgate-';
export const SUFFIX = {
  signature: 'signature',
  timestamp: 'timestamp',
  jobId: 'job-id',
  webhookId: 'webhook-id',
  event: 'event',
} as const;

export interface SignedHeaderValues {
  signature: string;
  timestamp: number;
  jobId: string;
  webhookId: number;
  event: string;
}

const [SIG, TS, JOB, HOOK, EVENT, LEGACY_SIG, LEGACY_TS, LEGACY_JOB, LEGACY_HOOK, LEGACY_EVENT] = [HEADER_PREFIX, LEGACY_HEADER_PREFIX].flatMap((p) =>
  [SUFFIX.signature, SUFFIX.timestamp, SUFFIX.jobId, SUFFIX.webhookId, SUFFIX.event].map((s) => p + s),
) as [string, string, string, string, string, string, string, string, string, string];

/**
 * The ten signing headers (five values under both prefixes, lower-case names) appended to `out` as a flat
 * name, value list, the form undici takes without walking an object's keys (the deliverer's per-send path).
 */
export function pushDeliveryHeaders(out: string[], v: SignedHeaderValues): string[] {
  const timestamp = String(v.timestamp);
  const webhookId = String(v.webhookId);
  out.push(
    SIG, v.signature, TS, timestamp, JOB, v.jobId, HOOK, webhookId, EVENT, v.event,
    LEGACY_SIG, v.signature, LEGACY_TS, timestamp, LEGACY_JOB, v.jobId, LEGACY_HOOK, webhookId, LEGACY_EVENT, v.event,
  );
  return out;
}

/** The ten signing headers as an object (lower-case names). */
export function deliveryHeaders(v: SignedHeaderValues): Record<string, string> {
  const list = pushDeliveryHeaders([], v);
  const out: Record<string, string> = {};
  for (let i = 0; i < list.length; i += 2) out[list[i]!] = list[i + 1]!;
  return out;
}
