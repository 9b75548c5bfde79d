// The body bytes and their SHA-256, made once at enqueue. Small envelopes are made inline; large ones
// (a big inlined result) in a piscina worker, so the jobs runner's event loop is not blocked while a
// multi-megabyte body is serialised and hashed (bench/webhooks.mjs measures where that pays).
import { Piscina } from 'piscina';
import type { JobEvent } from '../jobs/job-event.js';
import { serializeEnvelope } from './envelope.js';
import { bodySha256 } from './signature.js';

export interface EnvelopeBody {
  bytes: Uint8Array;
  sha256: string;
}

/** Estimated body size at which the worker pool is used (chosen from the bench figures in bench/RESULTS.md). */
export const OFFLOAD_AT_BYTES = 128 * 1024;

let pool: Piscina | null = null;

function workerPool(): Piscina {
  // Run from source under tsx (`npx tsx bench/…`) this module is the .ts file; compiled it is .js: load the worker in the same form.
  const ext = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
  pool ??= new Piscina({
    filename: new URL(`./envelope-worker${ext}`, import.meta.url).href,
    minThreads: 0,
    maxThreads: 2,
    idleTimeout: 10_000,
  });
  return pool;
}

/** ~JSON bytes per cell of a database result: a guess that only picks inline or worker, never a limit. */
const BYTES_PER_CELL = 12;

function cells(rows: unknown): number {
  if (!Array.isArray(rows)) return 0;
  const width = Array.isArray(rows[0]) ? (rows[0] as unknown[]).length : 1;
  return rows.length * width;
}

/**
 * A cheap size estimate from the field that is large in practice: the inlined http body, or the rows of an
 * inlined database result (both up to the 256 KiB inline cap), counted without serialising them.
 */
function estimatedBytes(event: JobEvent): number {
  const d = event.detail as { body?: unknown; rows?: unknown; results?: unknown } | undefined;
  if (typeof d?.body === 'string') return d.body.length;
  let n = cells(d?.rows);
  if (Array.isArray(d?.results)) for (const r of d.results as Array<{ rows?: unknown }>) n += cells(r?.rows);
  return n * BYTES_PER_CELL;
}

export function envelopeBodyInline(event: JobEvent): EnvelopeBody {
  const bytes = Buffer.from(serializeEnvelope(event), 'utf8');
  return { bytes, sha256: bodySha256(bytes) };
}

export async function envelopeBodyInWorker(event: JobEvent): Promise<EnvelopeBody> {
  return (await workerPool().run(event)) as EnvelopeBody;
}

export async function envelopeBody(event: JobEvent, offloadAtBytes = OFFLOAD_AT_BYTES): Promise<EnvelopeBody> {
  return estimatedBytes(event) >= offloadAtBytes ? envelopeBodyInWorker(event) : envelopeBodyInline(event);
}

/** Stops the worker threads (service shutdown, tests). */
export async function closeEnvelopeWorkers(): Promise<void> {
  const p = pool;
  pool = null;
  await p?.destroy();
}
