// The webhook deliverer (worker role): claims due outbox rows, signs each with its destination's current
// secret, POSTs it, records the attempt, and keeps each destination's failure streak (8 → deactivated).
//
// Claiming: a due row (next_attempt_at ≤ now, destination active) is claimed by moving next_attempt_at one
// lease ahead in a single UPDATE over `FOR UPDATE SKIP LOCKED` rows, so several workers never take the same
// row, and a worker that dies mid-send leaves a row that becomes due again when the lease ends
// (at-least-once). The result (attempt row, streak, delete or reschedule) is written in one transaction.
// In flight: at most `concurrency` deliveries, and at most `perDestination` for one destination, so a
// receiver that hangs holds only its own slots (each for at most the 5 s timeout).
import { readFileSync } from 'node:fs';
import { createSecureContext, rootCertificates } from 'node:tls';
import { Agent } from 'undici';
import type { Logger } from '../log.js';
import type { SecretBox } from '../security/secret-box.js';
import { guardedConnector } from '../security/connect-guard.js';
import { checkTarget, type TargetPolicy } from '../security/targets.js';
import { openCredential } from '../store/credentials.js';
import { CHANGE_CHANNEL, type Sql } from '../store/sql.js';
import { retryDelayMs, type RetrySchedule } from './backoff.js';
import { DELIVERY_CHANNEL } from './outbox.js';
import { deliveryHeaders, signDelivery } from './signature.js';

/** Spec: consecutive failures before deactivation. */
export const FAILURES_BEFORE_DEACTIVATION = 8;
/** Spec: a 2xx within 5 seconds is a success. */
export const DELIVERY_TIMEOUT_MS = 5000;
/** At most this much of a receiver's answer is read (to keep the connection); beyond it the socket is dropped. */
export const RESPONSE_READ_CAP = 64 * 1024;

export interface DelivererOptions {
  sql: Sql;
  box: SecretBox;
  log: Logger;
  targets: TargetPolicy;
  /** Extra CA certificates (PEM file) trusted for receivers, besides the system roots. */
  caFile: string | null;
  retry: RetrySchedule;
  /** How long a claimed row stays claimed; must exceed the delivery timeout. */
  leaseMs: number;
  concurrency: number;
  perDestination: number;
  /** Period of the due-row poll (enqueues and re-enables also wake the deliverer at once). */
  pollMs: number;
  timeoutMs?: number;
  random?: () => number;
}

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

export type AttemptOutcome =
  | { ok: true; status: number; latencyMs: number }
  | { ok: false; status: number | null; error: string; latencyMs: number };

export class Deliverer {
  readonly #o: Required<DelivererOptions>;
  readonly #agent: Agent;
  readonly #inFlight = new Set<Promise<void>>();
  readonly #perDestination = new Map<number, number>();
  #timer: NodeJS.Timeout | null = null;
  #unlisten: Array<() => Promise<void>> = [];
  #pumping = false;
  #again = false;
  #stopping = false;

  constructor(opts: DelivererOptions) {
    if (opts.leaseMs <= (opts.timeoutMs ?? DELIVERY_TIMEOUT_MS)) throw new Error('the claim lease must be longer than the delivery timeout');
    this.#o = { timeoutMs: DELIVERY_TIMEOUT_MS, random: Math.random, ...opts };
    let ca: string[] | undefined;
    if (opts.caFile) {
      try {
        ca = [...rootCertificates, readFileSync(opts.caFile, 'utf8')];
      } catch (err) {
        throw new Error(`cannot read webhookCaFile ${opts.caFile}: ${(err as Error).message}`);
      }
    }
    this.#agent = new Agent({
      // One context for every connection (a per-connection `ca` re-parses every root at each handshake).
      // Every connection re-resolves through the SSRF guard: a name that passed the check before the send
      // cannot resolve to a private address for the connection itself (DNS rebinding).
      connect: guardedConnector(opts.targets, ca ? { secureContext: createSecureContext({ ca }) } : {}),
      // No per-origin connection cap: the in-flight caps above bound sends, and two destinations on one
      // host (paths of one receiver) must not queue behind each other's hanging requests.
      keepAliveTimeout: 10_000,
      headersTimeout: this.#o.timeoutMs,
      bodyTimeout: this.#o.timeoutMs,
    });
  }

  async start(): Promise<void> {
    this.#unlisten.push(await this.#o.sql.listen(DELIVERY_CHANNEL, () => this.kick()));
    // A re-enabled destination (`webhook:<id>`) has kept rows that are due now.
    this.#unlisten.push(await this.#o.sql.listen(CHANGE_CHANNEL, (p) => p.startsWith('webhook:') && this.kick()));
    this.#timer = setInterval(() => this.kick(), this.#o.pollMs);
    this.#timer.unref();
    this.kick();
  }

  /** Deliveries being sent now. */
  get inFlight(): number {
    return this.#inFlight.size;
  }

  /** Looks for due rows now (called on enqueue notifications, the poll timer and each finished delivery). */
  kick(): void {
    if (this.#stopping) return;
    if (this.#pumping) {
      this.#again = true;
      return;
    }
    this.#pumping = true;
    void this.#pump()
      .catch((err: unknown) => this.#o.log.warn({ err }, 'webhook deliverer: claiming due deliveries failed; retrying at the next poll'))
      .finally(() => {
        this.#pumping = false;
        if (this.#again) {
          this.#again = false;
          this.kick();
        }
      });
  }

  /** Stops claiming, lets in-flight deliveries finish (each within the timeout) and closes connections. */
  async stop(): Promise<void> {
    this.#stopping = true;
    if (this.#timer) clearInterval(this.#timer);
    for (const u of this.#unlisten) await u().catch(() => {});
    this.#unlisten = [];
    await Promise.allSettled([...this.#inFlight]);
    await this.#agent.close().catch(() => {});
  }

  async #pump(): Promise<void> {
    // A read-only probe before the claiming UPDATE (a tenth of its cost): on the embedded store each
    // statement runs on the event loop that serves pool traffic, and most polls find nothing due.
    if (!(await this.#anyDue())) return;
    while (!this.#stopping) {
      const free = this.#o.concurrency - this.#inFlight.size;
      if (free <= 0) return;
      const rows = await this.#claim(free);
      if (rows.length === 0) return;
      for (const row of rows) this.#launch(row);
      if (rows.length < free) return;
    }
  }

  async #anyDue(): Promise<boolean> {
    const { rows } = await this.#o.sql.query<{ due: boolean }>('SELECT EXISTS (SELECT 1 FROM webhook_deliveries WHERE next_attempt_at <= now()) AS due');
    return rows[0]?.due === true;
  }

  /**
   * Claims up to `n` due rows in one statement: per destination the oldest due rows, no more than the
   * per-destination cap minus what this process already has in flight there; rows another worker holds
   * are skipped, not waited for.
   */
  async #claim(n: number): Promise<ClaimedRow[]> {
    const dests = [...this.#perDestination.keys()];
    const busy = dests.map((d) => this.#perDestination.get(d)!);
    const { rows } = await this.#o.sql.query<ClaimedRow>(
      `WITH due AS (
         SELECT d.id, d.next_attempt_at,
                row_number() OVER (PARTITION BY d.webhook_endpoint_id ORDER BY d.next_attempt_at, d.id) AS rn,
                $3::int - COALESCE((SELECT f.busy FROM unnest($4::int[], $5::int[]) AS f(dest, busy)
                                     WHERE f.dest = d.webhook_endpoint_id), 0) AS room
           FROM webhook_deliveries d JOIN webhook_endpoints w ON w.id = d.webhook_endpoint_id
          WHERE w.disabled = false AND d.next_attempt_at <= now()),
       pick AS (SELECT id FROM due WHERE rn <= room ORDER BY next_attempt_at, id LIMIT $1)
       UPDATE webhook_deliveries d
          SET next_attempt_at = now() + $2 * interval '1 millisecond', attempts = d.attempts + 1
         FROM webhook_endpoints w LEFT JOIN credentials c ON c.id = w.credential_id
        WHERE d.id IN (SELECT id FROM webhook_deliveries
                        WHERE id IN (SELECT id FROM pick) AND next_attempt_at <= now()
                          FOR UPDATE SKIP LOCKED)
          AND w.id = d.webhook_endpoint_id AND w.disabled = false
        RETURNING d.id, d.webhook_endpoint_id, d.job_id, d.pool_id, d.event_type, d.body, d.body_sha256, d.attempts,
                  w.url, w.signing_secret_enc, w.auth_header, c.secret_enc AS credential_enc`,
      [n, this.#o.leaseMs, this.#o.perDestination, dests, busy],
    );
    return rows;
  }

  #launch(row: ClaimedRow): void {
    const dest = row.webhook_endpoint_id;
    this.#perDestination.set(dest, (this.#perDestination.get(dest) ?? 0) + 1);
    const p = this.#deliver(row)
      .catch((err: unknown) =>
        // The store failed while recording: the row's lease ends and it is sent again (at-least-once).
        this.#o.log.warn({ err, job: row.job_id, webhook: dest }, 'webhook delivery: recording the attempt failed; it will be retried'),
      )
      .finally(() => {
        this.#inFlight.delete(p);
        const left = (this.#perDestination.get(dest) ?? 1) - 1;
        if (left === 0) this.#perDestination.delete(dest);
        else this.#perDestination.set(dest, left);
        this.kick();
      });
    this.#inFlight.add(p);
  }

  async #deliver(row: ClaimedRow): Promise<void> {
    const outcome = await this.send(row);
    await this.#record(row, outcome);
  }

  /** One POST: signed now, with the secret and credential read at claim time (so a rotation applies at once). */
  async send(row: ClaimedRow): Promise<AttemptOutcome> {
    const started = performance.now();
    const latency = () => Math.round(performance.now() - started);
    let url: URL;
    try {
      url = new URL(row.url);
    } catch {
      return { ok: false, status: null, error: 'invalid destination URL', latencyMs: 0 };
    }
    // The 5 s run from here: name resolution is part of the delivery's time.
    const signal = AbortSignal.timeout(this.#o.timeoutMs);
    // DNS may have changed since the URL was accepted: the SSRF guard runs again before every send.
    const verdict = await Promise.race([
      checkTarget(url.hostname, this.#o.targets),
      new Promise<null>((resolve) => signal.addEventListener('abort', () => resolve(null), { once: true })),
    ]);
    if (verdict === null) return { ok: false, status: null, error: 'timeout (no answer within 5 s)', latencyMs: latency() };
    if (!verdict.ok) return { ok: false, status: null, error: `destination refused: ${verdict.reason}`, latencyMs: latency() };

    const timestamp = Math.floor(Date.now() / 1000);
    let headers: Record<string, string>;
    try {
      const secret = this.#o.box.open(row.signing_secret_enc);
      headers = {
        'content-type': 'application/json',
        'user-agent': 'poolgate-webhooks/1',
        ...deliveryHeaders({
          signature: signDelivery(secret, timestamp, row.job_id, { sha256: row.body_sha256 }),
          timestamp,
          jobId: row.job_id,
          webhookId: row.webhook_endpoint_id,
          event: row.event_type,
        }),
      };
      if (row.credential_enc) {
        const cred = openCredential(this.#o.box, { secret_enc: row.credential_enc });
        if (cred.method === 'bearer_static') {
          const name = row.auth_header ?? 'authorization';
          headers[name] = name === 'authorization' ? `Bearer ${cred.token}` : cred.token;
        }
      }
    } catch (err) {
      return { ok: false, status: null, error: `cannot open the signing secret or credential: ${(err as Error).message}`, latencyMs: latency() };
    }

    try {
      const res = await this.#agent.request({
        origin: url.origin,
        path: `${url.pathname}${url.search}`,
        method: 'POST',
        headers,
        body: Buffer.from(row.body.buffer, row.body.byteOffset, row.body.byteLength),
        signal,
      });
      const ms = latency();
      // Read a little to keep the connection for the next delivery; a large or endless answer is cut off.
      await res.body.dump({ limit: RESPONSE_READ_CAP, signal }).catch(() => {});
      if (res.statusCode >= 200 && res.statusCode < 300) return { ok: true, status: res.statusCode, latencyMs: ms };
      const error = res.statusCode >= 300 && res.statusCode < 400 ? 'redirect not followed' : `HTTP ${res.statusCode}`;
      return { ok: false, status: res.statusCode, error, latencyMs: ms };
    } catch (err) {
      return { ok: false, status: null, error: describe(err, signal), latencyMs: latency() };
    }
  }

  async #record(row: ClaimedRow, outcome: AttemptOutcome): Promise<void> {
    const dest = row.webhook_endpoint_id;
    if (outcome.ok) {
      // One statement (atomic on its own): the attempt, the row leaves the outbox, the streak resets.
      await this.#o.sql.query(
        `WITH attempt AS (
           INSERT INTO webhook_delivery_attempts (webhook_endpoint_id, job_id, pool_id, result, http_status, error, attempt, latency_ms)
           VALUES ($1, $2, $3, 'success', $4, NULL, $5, $6)),
         done AS (DELETE FROM webhook_deliveries WHERE id = $7)
         UPDATE webhook_endpoints SET consecutive_failures = 0 WHERE id = $1 AND consecutive_failures <> 0`,
        [dest, row.job_id, row.pool_id, outcome.status, row.attempts, outcome.latencyMs, row.id],
      );
      return;
    }
    const deactivated = await this.#o.sql.transaction(async (tx) => {
      await tx.query(
        `INSERT INTO webhook_delivery_attempts (webhook_endpoint_id, job_id, pool_id, result, http_status, error, attempt, latency_ms)
         VALUES ($1, $2, $3, 'failure', $4, $5, $6, $7)`,
        [dest, row.job_id, row.pool_id, outcome.status, outcome.error, row.attempts, outcome.latencyMs],
      );
      // No SELECT … FOR UPDATE here: the attempt's foreign key holds a KEY SHARE lock on the destination,
      // and two recordings each holding one and then asking FOR UPDATE deadlocked on PostgreSQL (the
      // streak was rolled back and deactivation came late). The UPDATE's own row lock serialises them.
      // The streak is 0 after a re-enable, so reaching exactly 8 is the deactivating transition.
      const { rows } = await tx.query<{ deactivated: boolean }>(
        `UPDATE webhook_endpoints
            SET consecutive_failures = consecutive_failures + 1,
                disabled = disabled OR consecutive_failures + 1 >= $2,
                updated_at = now()
          WHERE id = $1 RETURNING disabled AND consecutive_failures = $2 AS deactivated`,
        [dest, FAILURES_BEFORE_DEACTIVATION],
      );
      if (row.attempts >= this.#o.retry.maxAttempts) {
        await tx.query('DELETE FROM webhook_deliveries WHERE id = $1', [row.id]);
        this.#o.log.warn({ job: row.job_id, webhook: dest, attempts: row.attempts }, 'webhook delivery given up after the last attempt');
      } else {
        const wait = retryDelayMs(this.#o.retry, row.attempts, this.#o.random);
        await tx.query(`UPDATE webhook_deliveries SET next_attempt_at = now() + $2 * interval '1 millisecond' WHERE id = $1`, [row.id, wait]);
      }
      const now = rows[0]?.deactivated === true;
      // The data plane falls back to sync for pools left with no active destination; told at commit.
      if (now) await tx.query('SELECT pg_notify($1, $2)', [CHANGE_CHANNEL, `webhook:${dest}`]);
      return now;
    });
    if (deactivated) this.#o.log.warn({ webhook: dest }, `webhook destination deactivated after ${FAILURES_BEFORE_DEACTIVATION} consecutive failed deliveries`);
  }
}

/** A short reason for the history: timeout, TLS, connection reset, … */
function describe(err: unknown, signal: AbortSignal): string {
  if (signal.aborted) return 'timeout (no answer within 5 s)';
  const e = err as { code?: string; message?: string; cause?: { code?: string; message?: string } };
  const code = e.cause?.code ?? e.code;
  if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT' || code === 'UND_ERR_CONNECT_TIMEOUT') return 'timeout (no answer within 5 s)';
  const msg = (e.cause?.message ?? e.message ?? String(err)).slice(0, 200);
  return code ? `${code}: ${msg}` : msg;
}
