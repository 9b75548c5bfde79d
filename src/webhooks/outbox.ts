// The webhook outbox: enqueueJobEvent writes one delivery per active attached destination, in the
// caller's transaction (the jobs runner's, with the job's terminal status), so a job's event is stored
// exactly when its status is. The deliverer reads the rows; see deliverer.ts.
import type { JobEvent } from '../jobs/job-event.js';
import { DELIVERY_CHANNEL, type Queryable } from '../store/sql.js';
import { EVENT_TYPE } from '../jobs/job-event.js';
import { envelopeBody } from './envelope-body.js';

export { DELIVERY_CHANNEL };

/**
 * Enqueues the event for every active (not disabled) destination attached to the event's pool and returns
 * how many deliveries were written. Enqueueing the same event twice writes nothing the second time.
 */
export async function enqueueJobEvent(tx: Queryable, event: JobEvent): Promise<number> {
  const { bytes, sha256 } = await envelopeBody(event);
  const { rowCount } = await tx.query(
    `INSERT INTO webhook_deliveries (webhook_endpoint_id, job_id, pool_id, event_type, body, body_sha256)
     SELECT w.id, $2, $1, $3, $4, $5
       FROM pool_webhooks pw JOIN webhook_endpoints w ON w.id = pw.webhook_endpoint_id
      WHERE pw.pool_id = $1 AND w.disabled = false
     ON CONFLICT (webhook_endpoint_id, job_id, event_type) DO NOTHING`,
    [event.poolId, event.jobId, EVENT_TYPE[event.status], Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength), sha256],
  );
  if (rowCount > 0) await tx.query('SELECT pg_notify($1, $2)', [DELIVERY_CHANNEL, String(event.poolId)]);
  return rowCount;
}
