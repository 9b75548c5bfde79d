// How a stored result is shown: the event detail and the poll answer inline the body as text when it is
// UTF-8 and fits 256 KiB, and otherwise point at the raw result address.
import type { JobDetail } from './job-event.js';
import type { StoredResult } from './job-store.js';
import { INLINE_BODY_CAP } from './job-limits.js';

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** The body as text, or null when it is not valid UTF-8 or is over the inline cap. */
export function inlineText(body: Buffer): string | null {
  if (body.length > INLINE_BODY_CAP) return null;
  try {
    return utf8.decode(body);
  } catch {
    return null;
  }
}

/** Response headers as name → string (repeated values joined with ", "; set-cookie with "\n" would be lossy too). */
export function flatHeaders(headers: Record<string, string | string[]>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(headers)) out[k] = Array.isArray(v) ? v.join(', ') : v;
  return out;
}

export const pollUrl = (lockApiUrl: string, subdomain: string, jobId: string): string =>
  `${lockApiUrl.replace(/\/+$/, '')}/pools/${encodeURIComponent(subdomain)}/jobs/${jobId}`;

export const resultUrl = (lockApiUrl: string, subdomain: string, jobId: string): string => `${pollUrl(lockApiUrl, subdomain, jobId)}/result`;

/**
 * The `database` detail of a completed job's event: the answer inline when its JSON (`bytes` long) fits
 * 256 KiB and is whole, otherwise the address of the stored result.
 */
export function databaseDetail(status: number, answer: Record<string, unknown>, bytes: number, truncated: boolean, url: string): JobDetail {
  if (truncated) return { kind: 'database', status, resultUrl: url, truncated: true };
  if (bytes > INLINE_BODY_CAP) return { kind: 'database', status, resultUrl: url };
  return { kind: 'database', status, ...(status === 200 ? answer : { error: answer }) };
}

/** The stored JSON answer of a database job as the poll shows it: the result on success, `{error}` otherwise. */
export function databaseData(status: number, text: string): Record<string, unknown> {
  const value = JSON.parse(text) as Record<string, unknown>;
  return status === 200 ? value : { error: value };
}

/** The `http` detail of a completed job's event. */
export function httpDetail(result: StoredResult, url: string): JobDetail {
  const text = inlineText(result.body);
  const base = text === null ? { kind: 'http' as const, resultUrl: url } : { kind: 'http' as const, status: result.status, headers: flatHeaders(result.headers), body: text };
  return result.truncated ? { ...base, truncated: true } : base;
}
