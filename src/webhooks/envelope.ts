// The event envelope (spec: Body): a job event serialised once, in the spec's key order, into the exact
// bytes every attempt of the delivery sends.
import { EVENT_TYPE, type JobDetail, type JobEvent } from '../jobs/job-event.js';

export interface Envelope {
  apiVersion: '1';
  type: string;
  id: string;
  pool: string;
  reason: JobEvent['reason'];
  createdAt: number;
  completedAt: number;
  detail?: JobDetail;
}

/** The envelope of an event; keys are created in the spec's order, and `detail` only when there is one. */
export function envelopeOf(event: JobEvent): Envelope {
  const env: Envelope = {
    apiVersion: '1',
    type: EVENT_TYPE[event.status],
    id: event.jobId,
    pool: event.poolHost,
    reason: event.reason,
    createdAt: event.createdAt,
    completedAt: event.completedAt,
  };
  if (event.detail !== undefined) env.detail = event.detail;
  return env;
}

/** The body text (UTF-8 JSON). JSON.stringify escapes lone surrogates and control characters, so the text is storable. */
export function serializeEnvelope(event: JobEvent): string {
  return JSON.stringify(envelopeOf(event));
}
