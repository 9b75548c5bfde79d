// Piscina task: serialise an event's envelope and hash it off the event loop (used for large bodies;
// see envelope-body.ts). The bytes are moved back, not copied.
import { Piscina } from 'piscina';
import type { JobEvent } from '../jobs/job-event.js';
import { serializeEnvelope } from './envelope.js';
import { bodySha256 } from './signature.js';

export default function envelopeBody(event: JobEvent): unknown {
  const body = Buffer.from(serializeEnvelope(event), 'utf8');
  const sha256 = bodySha256(body);
  // A fresh ArrayBuffer (not the shared pool slab) so it can be transferred.
  const bytes = new Uint8Array(body.length);
  bytes.set(body);
  // Piscina's transferable wrapper: the value is posted back with its buffer moved, not cloned.
  return Piscina.move({ [Piscina.transferableSymbol]: bytes.buffer, [Piscina.valueSymbol]: { bytes, sha256 } } as never);
}
