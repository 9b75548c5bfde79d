// The deliverer's one round trip to the store: claims due outbox rows and, in the same statement, writes the
// outcomes gathered since the last one (outcomes.ts), so a steady stream of deliveries costs one statement per
// batch instead of two (docs/jobs-and-webhooks.md, "Batches").
import type { Queryable, SqlParam } from '../store/sql.js';
import { RECORD_CTES, RECORD_PARAMS, recordParams, type Outcome } from './outcomes.js';

/** A claimed outbox row joined with its destination's current URL, secret and credential. */
export interface ClaimedRow {
  id: string;
  webhook_endpoint_id: number;
  job_id: string;
  pool_id: number | null;
  event_type: string;
  body: Uint8Array;
  body_sha256: string;
  attempts: number;
  url: string;
  signing_secret_enc: string;
  auth_header: string | null;
  credential_enc: string | null;
}

export interface Claim {
  /** At most this many rows in all. */
  n: number;
  /** How long a claimed row stays claimed (ms). */
  leaseMs: number;
  /** Room of each destination this worker has sent to (dests[i] may take rooms[i] rows; 0: none). */
  dests: readonly number[];
  rooms: readonly number[];
  /** Room of a destination not in `dests`. */
  initialRoom: number;
}

export interface OutcomeBatch {
  outcomes: readonly Outcome[];
  failuresBeforeDeactivation: number;
}

/**
 * The claim's expressions, its parameters numbered from $p+1: for each active destination its oldest due
 * rows, as many as its room; rows another worker holds are skipped, not waited for. Each is claimed by
 * moving its due time one lease ahead and counting the attempt. With `skipRecorded` a row whose outcome the
 * same statement writes (its lease ran out before the outcome came back) is left to that write: a statement
 * must not update one row twice.
 */
function claimCtes(p: number, skipRecorded: boolean): string {
  const $ = (i: number): string => `$${p + i}`;
  return `room AS (SELECT * FROM unnest(${$(3)}::int[], ${$(4)}::int[]) AS r(dest, room)),
     pick AS (
       SELECT d.id, d.next_attempt_at
         FROM webhook_endpoints w
         CROSS JOIN LATERAL (
           SELECT d.id, d.next_attempt_at FROM webhook_deliveries d
            WHERE d.webhook_endpoint_id = w.id AND d.status = 'pending' AND d.next_attempt_at <= now()${skipRecorded ? ' AND d.id NOT IN (SELECT id FROM o)' : ''}
            ORDER BY d.next_attempt_at, d.id
            LIMIT COALESCE((SELECT r.room FROM room r WHERE r.dest = w.id), ${$(5)})
            FOR UPDATE OF d SKIP LOCKED) d
        WHERE w.disabled = false
        ORDER BY d.next_attempt_at, d.id
        LIMIT ${$(1)}),
     claimed AS (
       UPDATE webhook_deliveries d
          SET next_attempt_at = now() + ${$(2)} * interval '1 millisecond', attempts = d.attempts + 1
         FROM webhook_endpoints w LEFT JOIN credentials c ON c.id = w.credential_id
        WHERE d.id IN (SELECT id FROM pick) AND w.id = d.webhook_endpoint_id
        RETURNING d.id, d.webhook_endpoint_id, d.job_id, d.pool_id, d.event_type, d.body, d.body_sha256, d.attempts,
                  w.url, w.signing_secret_enc, w.auth_header, c.secret_enc AS credential_enc)`;
}

const CLAIM_ONLY = `WITH ${claimCtes(0, false)}\n     SELECT * FROM claimed`;
// One row at least (the deactivated list), joined with each claimed row.
const CLAIM_AND_RECORD = `WITH ${RECORD_CTES},
     ${claimCtes(RECORD_PARAMS, true)}
     SELECT c.*, x.ids AS deactivated FROM (SELECT array_agg(id) AS ids FROM deactivated) x LEFT JOIN claimed c ON true`;

/**
 * Claims due rows and writes `record`'s outcomes in one statement (one transaction). PostgreSQL gives every
 * part of a statement the same snapshot, so the claim does not see what the write changes: the caller gives a
 * destination with a failure in the batch no room, and claims for it only after this statement has committed
 * (its 8th failure deactivates it before anything more is claimed for it).
 */
export async function claimAndRecord(db: Queryable, claim: Claim, record: OutcomeBatch | null): Promise<{ rows: ClaimedRow[]; deactivated: number[] }> {
  const params = (p: SqlParam[]): SqlParam[] => [...p, claim.n, claim.leaseMs, claim.dests, claim.rooms, claim.initialRoom];
  if (!record || record.outcomes.length === 0) {
    const { rows } = await db.query<ClaimedRow>(CLAIM_ONLY, params([]));
    return { rows, deactivated: [] };
  }
  const { rows } = await db.query<ClaimedRow & { deactivated: number[] | null }>(
    CLAIM_AND_RECORD,
    params(recordParams(record.outcomes, record.failuresBeforeDeactivation)),
  );
  return { rows: rows.filter((r) => r.id !== null), deactivated: rows[0]?.deactivated ?? [] };
}
