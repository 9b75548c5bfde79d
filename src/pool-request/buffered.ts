// A pool request held in memory (an async job's stored request) and the origin's answer collected into
// memory. The data plane's forward stage sends it (src/dataplane/forward.ts forwardBuffered); the job
// runner is handed that as a ForwardBuffered, so jobs/ does not import the data plane.
import type { Outcome } from '../governor/governor.js';
import type { PoolEntry } from './snapshot.js';

/** A request to send to the origin from memory (an async job's stored request). */
export interface BufferedRequest {
  method: string;
  path: string;
  query: string;
  /** Client headers, names lower-case; pool auth already removed. */
  headers: Record<string, string>;
  clientAddress: string;
  body: Buffer | null;
}

/** The origin's answer collected into memory, cut at the cap. */
export interface BufferedResponse {
  status: number;
  headers: Record<string, string | string[]>;
  body: Buffer;
  /** The body is incomplete: over the cap, or the origin broke off mid-body. */
  truncated: boolean;
}

export type BufferedResult =
  | { ok: true; response: BufferedResponse; upstream: Outcome }
  /** No answer from the origin; `error` says why. `retryable` is false when undici refused the request itself. */
  | { ok: false; error: string; retryable: boolean; upstream: Outcome };

/** Sends a buffered request to the pool's origin, collecting at most `cap` bytes of the answer; resolves, never rejects. */
export type ForwardBuffered = (pool: PoolEntry, req: BufferedRequest, cap: number) => Promise<BufferedResult>;
