// The webhook deliverer (worker role): claims due outbox rows in batches, signs each with its destination's
// current secret, POSTs it over a warm keep-alive connection, and records the outcomes in batches, keeping
// each destination's failure streak (8 → deactivated). See docs/jobs-and-webhooks.md.
//
// Two loops, each one statement at a time: the recorder writes every outcome gathered so far (one
// statement), the claimer claims due rows for every destination with room (one statement) and sends them.
// Work that arrives while a statement runs is gathered for the next one, and both loops run at most once
// per LINGER_MS (a notification after a quiet spell is claimed at once; at a steady rate of single-event
// transactions, one claim and one record cover every event of the last few ms instead of a statement per
// notification and per finished send: each statement costs the process far more CPU than a POST). A destination with a failure not yet
// written gets no new claims until it is: its 8th failure is in the store (deactivated) before anything
// more is claimed for it, so only the sends already in flight can follow it.
//
// Claiming: a due row (pending, next_attempt_at ≤ now, destination active) is claimed by moving
// next_attempt_at one lease ahead under `FOR UPDATE SKIP LOCKED`, so several workers never take the same
// row, and a worker that dies mid-send leaves a row that becomes due again when the lease ends
// (at-least-once). In flight: at most `concurrency` in all, and per destination an adaptive limit
// (destination-limit.ts) under the `perDestination` ceiling, so a slow or failing receiver holds only
// its own slots and never slows the others.
import { readFileSync } from 'node:fs';
import { createSecureContext, rootCertificates } from 'node:tls';
import { Agent } from 'undici';
import type { Logger } from '../log.js';
import type { SecretBox } from '../security/secret-box.js';
import { guardedConnector } from '../security/ssrf-connect-guard.js';
import { checkTarget, type TargetPolicy, type TargetVerdict } from '../security/targets.js';
import { SYSTEM_TIME, type GovernorTime } from '../governor/clock.js';
import { openCredential } from '../store/credentials.js';
import { CHANGE_CHANNEL, type Sql } from '../store/sql.js';
import { retryDelayMs, type RetrySchedule } from './backoff.js';
import { DestinationLimit } from './destination-limit.js';
import { recordOutcomes, type Outcome } from './outcomes.js';
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
  /** Deliveries in flight at once, all destinations together. */
  concurrency: number;
  /** Ceiling of one destination's adaptive in-flight limit. */
  perDestination: number;
  /** Where a destination's limit starts (default min(8, perDestination)). */
  initialPerDestination?: number;
  /** Period of the due-row poll (enqueues and re-enables also wake the deliverer at once). */
  pollMs: number;
  /** At most one claim and one record per this many ms (default LINGER_MS). */
  lingerMs?: number;
  /** Finished deliveries are kept this long for replay, then pruned (default 30 days). */
  retentionMs?: number;
  timeoutMs?: number;
  random?: () => number;
  /**
   * The clock and timers of a send's timeout and its measured latency (default the system's): a test drives
   * them to pass the timeout without waiting it out (issue 28 §1).
   */
  time?: Pick<GovernorTime, 'now' | 'timers'>;
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

/** How long a send-time SSRF verdict for a host name is reused (new connections are checked anyway). */
const TARGET_VERDICT_MS = 1000;
/**
 * At most one claim and one record per this many ms (the first after a quiet spell runs at once): the
 * latency it may add to a delivery at a steady rate, for a few statements per batch of events instead of
 * per event.
 */
export const LINGER_MS = 5;
/** Period of the pruning of finished deliveries past their retention. */
const PRUNE_EVERY_MS = 60_000;
const DEFAULT_RETENTION_MS = 30 * 24 * 3600 * 1000;

export class Deliverer {
  readonly #o: Required<DelivererOptions>;
  readonly #agent: Agent;
  readonly #inFlight = new Set<Promise<void>>();
  readonly #limits = new Map<number, DestinationLimit>();
  #outcomes: Outcome[] = [];
  #timer: NodeJS.Timeout | null = null;
  #unlisten: Array<() => Promise<void>> = [];
  #pumping = false;
  /** Something asked to look for due rows (a notification, the poll, a freed slot with rows left behind). */
  #want = false;
  #recording: Promise<void> | null = null;
  /** Failures not yet written, by destination: it gets no new claims until they are. */
  readonly #unwrittenFailures = new Map<number, number>();
  /** Something may be due now (a notification, a full claim): claim without the read-only probe first. */
  #hint = true;
  /** The last claim may have left due rows behind (a destination or the total at its room): a finished send claims again. */
  #backlog = false;
  /** When the claimer and recorder last ran, and the timer that runs them again LINGER_MS after that. */
  #lastRun = -Infinity;
  #lingerTimer: NodeJS.Timeout | null = null;
  #stopping = false;
  #lastPrune = 0;
  /** Send-time SSRF verdicts by host name, with their time. */
  readonly #verdicts = new Map<string, { at: number; verdict: Promise<TargetVerdict>; settled: TargetVerdict | null }>();
  /** Opened signing secrets by their sealed form (a rotation seals a new value, so it misses). */
  readonly #secrets = new Map<string, string>();
  /** Batches written and rows claimed; for the bench and diagnostics. */
  readonly stats = { claims: 0, claimed: 0, claimMs: 0, records: 0, recorded: 0, recordMs: 0 };

  constructor(opts: DelivererOptions) {
    if (opts.leaseMs <= (opts.timeoutMs ?? DELIVERY_TIMEOUT_MS)) throw new Error('the claim lease must be longer than the delivery timeout');
    this.#o = {
      timeoutMs: DELIVERY_TIMEOUT_MS,
      random: Math.random,
      initialPerDestination: Math.min(8, opts.perDestination),
      retentionMs: DEFAULT_RETENTION_MS,
      lingerMs: LINGER_MS,
      time: SYSTEM_TIME,
      ...opts,
    };
    let ca: string[] | undefined;
    if (opts.caFile) {
      try {
        ca = [...rootCertificates, readFileSync(opts.caFile, 'utf8')];
      } catch (err) {
        throw new Error(`cannot read webhookCaFile ${opts.caFile}: ${(err as Error).message}`);
      }
    }
    // One undici Pool per destination origin inside the Agent, its connections kept alive between
    // deliveries (a TLS handshake costs far more than a POST on a warm connection).
    this.#agent = new Agent({
      // One context for every connection (a per-connection `ca` re-parses every root at each handshake).
      // Every connection re-resolves through the SSRF guard: a name that passed the check before the send
      // cannot resolve to a private address for the connection itself (DNS rebinding).
      connect: guardedConnector(opts.targets, ca ? { secureContext: createSecureContext({ ca }) } : {}),
      // No per-origin connection cap: the in-flight limits bound sends, and two destinations on one
      // host (paths of one receiver) must not queue behind each other's hanging requests.
      keepAliveTimeout: 30_000,
      keepAliveMaxTimeout: 60_000,
      // A backstop only: the send's own timer (below), started first, ends a send at the timeout. On a driven
      // clock that timer alone decides (undici's follow the wall clock); 0 turns them off.
      headersTimeout: this.#o.time.timers === SYSTEM_TIME.timers ? this.#o.timeoutMs : 0,
      bodyTimeout: this.#o.time.timers === SYSTEM_TIME.timers ? this.#o.timeoutMs : 0,
    });
  }

  async start(): Promise<void> {
    this.#unlisten.push(await this.#o.sql.listen(DELIVERY_CHANNEL, () => this.#wake()));
    // A re-enabled destination (`webhook:<id>`) has kept rows that are due now; a replay made one due.
    this.#unlisten.push(await this.#o.sql.listen(CHANGE_CHANNEL, (p) => p.startsWith('webhook:') && this.#wake()));
    this.#timer = setInterval(() => this.kick(), this.#o.pollMs);
    if (process.env.POOLGATE_DEBUG_DELIVERER) setInterval(() => this.#o.log.warn({ stats: this.stats, inFlight: this.#inFlight.size, limits: [...this.#limits].map(([d, l]) => [d, l.limit, l.inFlight]) }, 'deliverer stats'), 2000).unref();
    this.#timer.unref();
    this.#wake();
  }

  /** Deliveries being sent now. */
  get inFlight(): number {
    return this.#inFlight.size;
  }

  /** The adaptive in-flight limit of a destination now (its initial value if it has not been sent to). */
  limitOf(dest: number): number {
    return this.#limits.get(dest)?.limit ?? this.#o.initialPerDestination;
  }

  #wake(): void {
    this.#hint = true;
    this.kick();
  }

  /** Looks for due rows (after a read-only probe unless something hinted that rows are due), and records. */
  kick(): void {
    this.#want = true;
    this.#schedule();
  }

  /**
   * Records what finished and looks for due rows (notifications, the poll timer, each finished send): now if
   * the loops last ran LINGER_MS ago or more, else once when that much has passed, for everything asked meanwhile.
   */
  #schedule(): void {
    // Stopping: stop() records what is left itself.
    if (this.#lingerTimer || this.#stopping) return;
    const wait = this.#lastRun + this.#o.lingerMs - performance.now();
    if (wait > 0) {
      this.#lingerTimer = setTimeout(() => {
        this.#lingerTimer = null;
        this.#run();
      }, wait);
      return;
    }
    this.#run();
  }

  #run(): void {
    this.#lastRun = performance.now();
    if (this.#outcomes.length > 0) this.#record();
    // Asked while a claim runs: the claimer runs again when it ends.
    if (this.#stopping || !this.#want || this.#pumping) return;
    this.#want = false;
    this.#pumping = true;
    void this.#pump()
      .catch((err: unknown) => this.#o.log.warn({ err }, 'webhook deliverer: claiming due deliveries failed; retrying at the next poll'))
      .finally(() => {
        this.#pumping = false;
        if (this.#want) this.#schedule();
      });
  }

  /** The recorder: writes the gathered outcomes in one batch; what comes back meanwhile waits for the next run. */
  #record(): void {
    if (this.#recording) return;
    this.#recording = (async () => {
      const heldBack = this.#unwrittenFailures.size > 0;
      try {
        await this.#flush();
      } finally {
        this.#recording = null;
      }
      if (this.#stopping) return;
      // Destinations held back by an unwritten failure may claim again.
      if (heldBack) {
        this.#hint = true;
        this.kick();
      } else if (this.#outcomes.length > 0) this.#schedule();
    })();
  }

  /** Stops claiming, lets in-flight deliveries finish (each within the timeout), records them and closes connections. */
  async stop(): Promise<void> {
    this.#stopping = true;
    if (this.#timer) clearInterval(this.#timer);
    if (this.#lingerTimer) clearTimeout(this.#lingerTimer);
    this.#lingerTimer = null;
    for (const u of this.#unlisten) await u().catch(() => {});
    this.#unlisten = [];
    await Promise.allSettled([...this.#inFlight]);
    while (this.#pumping || this.#recording) {
      await this.#recording;
      await new Promise((r) => setTimeout(r, 5));
    }
    await this.#flush().catch((err: unknown) => this.#o.log.warn({ err }, 'webhook deliverer: recording the last outcomes failed; those deliveries will be sent again'));
    await this.#agent.close().catch(() => {});
  }

  async #pump(): Promise<void> {
    for (;;) {
      if (this.#stopping) return;
      const free = this.#o.concurrency - this.#inFlight.size;
      if (free <= 0) return;
      if (!this.#hint) {
        // A read-only probe before the claiming UPDATE (a tenth of its cost): on the embedded store each
        // statement runs on the event loop that serves pool traffic, and most polls find nothing due.
        if (!(await this.#anyDue())) return;
      }
      this.#hint = false;
      const rows = await this.#claim(free);
      for (const row of rows) this.#launch(row);
      // A full claim may have left due rows behind: claim again at once.
      if (rows.length < free) {
        await this.#prune();
        return;
      }
      this.#hint = true;
    }
  }

  async #anyDue(): Promise<boolean> {
    const { rows } = await this.#o.sql.query<{ due: boolean }>(
      `SELECT EXISTS (SELECT 1 FROM webhook_deliveries WHERE status = 'pending' AND next_attempt_at <= now()) AS due`,
    );
    return rows[0]?.due === true;
  }

  /**
   * Claims up to `n` due rows in one statement: for each active destination its oldest due rows, as many
   * as its room (adaptive limit minus what this process has in flight there; the initial limit for one
   * not sent to yet); rows another worker holds are skipped, not waited for.
   */
  async #claim(n: number): Promise<ClaimedRow[]> {
    const dests: number[] = [];
    const rooms: number[] = [];
    for (const [dest, l] of this.#limits) {
      dests.push(dest);
      rooms.push(this.#unwrittenFailures.has(dest) ? 0 : l.room);
    }
    const started = performance.now();
    this.#backlog = true;
    const { rows } = await this.#o.sql.query<ClaimedRow>(
      `WITH room AS (SELECT * FROM unnest($3::int[], $4::int[]) AS r(dest, room)),
       pick AS (
         SELECT d.id, d.next_attempt_at
           FROM webhook_endpoints w
           CROSS JOIN LATERAL (
             SELECT d.id, d.next_attempt_at FROM webhook_deliveries d
              WHERE d.webhook_endpoint_id = w.id AND d.status = 'pending' AND d.next_attempt_at <= now()
              ORDER BY d.next_attempt_at, d.id
              LIMIT COALESCE((SELECT r.room FROM room r WHERE r.dest = w.id), $5)
              FOR UPDATE OF d SKIP LOCKED) d
          WHERE w.disabled = false
          ORDER BY d.next_attempt_at, d.id
          LIMIT $1)
       UPDATE webhook_deliveries d
          SET next_attempt_at = now() + $2 * interval '1 millisecond', attempts = d.attempts + 1
         FROM webhook_endpoints w LEFT JOIN credentials c ON c.id = w.credential_id
        WHERE d.id IN (SELECT id FROM pick) AND w.id = d.webhook_endpoint_id
        RETURNING d.id, d.webhook_endpoint_id, d.job_id, d.pool_id, d.event_type, d.body, d.body_sha256, d.attempts,
                  w.url, w.signing_secret_enc, w.auth_header, c.secret_enc AS credential_enc`,
      [n, this.#o.leaseMs, dests, rooms, this.#o.initialPerDestination],
    );
    this.stats.claims++;
    this.stats.claimed += rows.length;
    this.stats.claimMs += performance.now() - started;
    this.#backlog = rows.length >= n || this.#atRoom(rows, dests, rooms);
    return rows;
  }

  /** Whether a destination got as many rows as its room (0 included): it may have more due than it could take. */
  #atRoom(rows: readonly ClaimedRow[], dests: readonly number[], rooms: readonly number[]): boolean {
    const got = new Map<number, number>();
    for (const r of rows) got.set(r.webhook_endpoint_id, (got.get(r.webhook_endpoint_id) ?? 0) + 1);
    for (let i = 0; i < dests.length; i++) if ((got.get(dests[i]!) ?? 0) >= rooms[i]!) return true;
    for (const [dest, n] of got) if (!this.#limits.has(dest) && n >= this.#o.initialPerDestination) return true;
    return false;
  }

  #limitFor(dest: number): DestinationLimit {
    let l = this.#limits.get(dest);
    if (!l) {
      l = new DestinationLimit({ initial: this.#o.initialPerDestination, min: 1, max: this.#o.perDestination });
      this.#limits.set(dest, l);
    }
    return l;
  }

  #launch(row: ClaimedRow): void {
    const dest = row.webhook_endpoint_id;
    const limit = this.#limitFor(dest);
    limit.inFlight++;
    const p = this.send(row)
      .then((outcome) => {
        limit.inFlight--;
        limit.onOutcome(outcome.ok, outcome.latencyMs, performance.now());
        this.#outcomes.push(this.#outcomeOf(row, outcome));
        if (!outcome.ok) this.#unwrittenFailures.set(dest, (this.#unwrittenFailures.get(dest) ?? 0) + 1);
      })
      .finally(() => {
        this.#inFlight.delete(p);
        // The freed slot matters only if the last claim may have left rows behind; the outcome is recorded either way.
        if (this.#backlog) {
          this.#hint = true;
          this.#want = true;
        }
        this.#schedule();
      });
    this.#inFlight.add(p);
  }

  #outcomeOf(row: ClaimedRow, outcome: AttemptOutcome): Outcome {
    let retryMs: number | null = null;
    if (!outcome.ok && row.attempts < this.#o.retry.maxAttempts) retryMs = retryDelayMs(this.#o.retry, row.attempts, this.#o.random);
    if (!outcome.ok && retryMs === null) {
      this.#o.log.warn({ job: row.job_id, webhook: row.webhook_endpoint_id, attempts: row.attempts }, 'webhook delivery given up after the last attempt');
    }
    return {
      rowId: row.id,
      dest: row.webhook_endpoint_id,
      jobId: row.job_id,
      poolId: row.pool_id,
      ok: outcome.ok,
      status: outcome.status,
      error: outcome.ok ? null : outcome.error,
      attempt: row.attempts,
      latencyMs: outcome.latencyMs,
      retryMs,
    };
  }

  /** Writes every gathered outcome in one statement. A failed write drops them: their rows come back when the lease ends. */
  async #flush(): Promise<void> {
    if (this.#outcomes.length === 0) return;
    const batch = this.#outcomes;
    this.#outcomes = [];
    let deactivated: number[];
    const started = performance.now();
    try {
      deactivated = await recordOutcomes(this.#o.sql, batch, FAILURES_BEFORE_DEACTIVATION);
    } catch (err) {
      this.#o.log.warn({ err, deliveries: batch.length }, 'webhook delivery: recording the attempts failed; they will be sent again when their claim lease ends');
      return;
    } finally {
      for (const o of batch) {
        if (o.ok) continue;
        const left = (this.#unwrittenFailures.get(o.dest) ?? 1) - 1;
        if (left <= 0) this.#unwrittenFailures.delete(o.dest);
        else this.#unwrittenFailures.set(o.dest, left);
      }
    }
    this.stats.records++;
    this.stats.recorded += batch.length;
    this.stats.recordMs += performance.now() - started;
    for (const dest of deactivated) {
      this.#o.log.warn({ webhook: dest }, `webhook destination deactivated after ${FAILURES_BEFORE_DEACTIVATION} consecutive failed deliveries`);
    }
  }

  /** Drops finished deliveries past their retention (at most once a minute). */
  async #prune(): Promise<void> {
    const now = Date.now();
    if (now - this.#lastPrune < PRUNE_EVERY_MS) return;
    this.#lastPrune = now;
    await this.#o.sql.query(
      `DELETE FROM webhook_deliveries WHERE status <> 'pending' AND finished_at < now() - $1 * interval '1 millisecond'`,
      [this.#o.retentionMs],
    );
  }

  /** A settled verdict for the host from the last second, or null. */
  #verdictNow(host: string): TargetVerdict | null {
    const hit = this.#verdicts.get(host);
    return hit && hit.settled && performance.now() - hit.at < TARGET_VERDICT_MS ? hit.settled : null;
  }

  #checkTarget(host: string): Promise<TargetVerdict> {
    const now = performance.now();
    const hit = this.#verdicts.get(host);
    if (hit && now - hit.at < TARGET_VERDICT_MS) return hit.verdict;
    const entry: { at: number; verdict: Promise<TargetVerdict>; settled: TargetVerdict | null } = { at: now, verdict: checkTarget(host, this.#o.targets), settled: null };
    void entry.verdict.then((v) => (entry.settled = v), () => {});
    if (this.#verdicts.size > 10_000) this.#verdicts.clear();
    this.#verdicts.set(host, entry);
    return entry.verdict;
  }

  #secret(sealed: string): string {
    let s = this.#secrets.get(sealed);
    if (s === undefined) {
      s = this.#o.box.open(sealed);
      if (this.#secrets.size > 10_000) this.#secrets.clear();
      this.#secrets.set(sealed, s);
    }
    return s;
  }

  /** One POST: signed now, with the secret and credential read at claim time (so a rotation applies at once). */
  async send(row: ClaimedRow): Promise<AttemptOutcome> {
    const { now, timers } = this.#o.time;
    const started = now();
    const latency = () => Math.round(now() - started);
    let url: URL;
    try {
      url = new URL(row.url);
    } catch {
      return { ok: false, status: null, error: 'invalid destination URL', latencyMs: 0 };
    }
    // The 5 s run from here: name resolution is part of the delivery's time. One timer, cleared when the
    // send ends (AbortSignal.timeout's timer would fire, and build its DOMException, 5 s after every send).
    const ac = new AbortController();
    const signal = ac.signal;
    const timer = timers.setTimeout((c) => c.abort(), this.#o.timeoutMs, ac);
    try {
      return await this.#sendSigned(row, url, signal, latency);
    } finally {
      timers.clearTimeout(timer);
    }
  }

  async #sendSigned(row: ClaimedRow, url: URL, signal: AbortSignal, latency: () => number): Promise<AttemptOutcome> {
    // DNS may have changed since the URL was accepted: the SSRF guard runs again before every send (its
    // verdict reused for a second; every new connection is checked again by the connector).
    const cached = this.#verdictNow(url.hostname);
    const verdict =
      cached ??
      (await Promise.race([
        this.#checkTarget(url.hostname),
        new Promise<null>((resolve) => signal.addEventListener('abort', () => resolve(null), { once: true })),
      ]));
    if (verdict === null) return { ok: false, status: null, error: 'timeout (no answer within 5 s)', latencyMs: latency() };
    if (!verdict.ok) return { ok: false, status: null, error: `destination refused: ${verdict.reason}`, latencyMs: latency() };

    const timestamp = Math.floor(Date.now() / 1000);
    let headers: Record<string, string>;
    try {
      const secret = this.#secret(row.signing_secret_enc);
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
