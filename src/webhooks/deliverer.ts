// The webhook deliverer (worker role): claims due outbox rows in batches, signs each with its destination's
// current secret, POSTs it over a warm keep-alive connection, and records the outcomes in batches, keeping
// each destination's failure streak (8 → deactivated). See docs/jobs-and-webhooks.md.
//
// Two loops, each one statement at a time: the claimer claims due rows for every destination with room and
// sends them, and writes the outcomes gathered so far in the same statement (claim.ts); the recorder writes
// them alone only when the claimer cannot take them (it is mid-statement, or nothing is to be claimed). Work
// that arrives while a statement runs is gathered for the next one, and both loops run at most once per
// LINGER_MS (a notification after a quiet spell is claimed at once; at a steady rate of single-event
// transactions, one statement covers every event and every finished send of the last few ms instead of a
// statement per notification and per finished send: each statement costs the process far more CPU than a POST). A destination with a failure not yet
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
import { claimAndRecord, type ClaimedRow } from './claim.js';
import { DestinationLimit } from './destination-limit.js';
import type { Outcome } from './outcomes.js';
import { DELIVERY_CHANNEL } from './outbox.js';
import { pushDeliveryHeaders, signDelivery } from './signature.js';
import { NextLook, sleepUntil } from '../store/next-look.js';

export type { ClaimedRow } from './claim.js';

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
  /** Period of the due-row poll while deliveries are going on (enqueues and re-enables also wake the deliverer at once). */
  pollMs: number;
  /**
   * The longest an idle deliverer sleeps (default pollMs): when nothing is due it looks again at the outbox's next
   * due moment (a retry, a claim's lease end) or after this, whichever comes first. On a store this process holds
   * alone every enqueue and re-enable wakes it, so it can be long; on a shared one another worker's retries and
   * lapsing claims arrive unannounced.
   */
  idlePollMs?: number;
  /** At most one statement (claim and record) per this many ms (default LINGER_MS). */
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

export type AttemptOutcome =
  | { ok: true; status: number; latencyMs: number }
  | { ok: false; status: number | null; error: string; latencyMs: number };

/** How long a send-time SSRF verdict for a host name is reused (new connections are checked anyway). */
const TARGET_VERDICT_MS = 1000;
/**
 * At most one statement (claim and record) per this many ms (the first after a quiet spell runs at once):
 * the latency it may add to a delivery at a steady rate, for one statement per batch of events instead of
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
  /** The next poll. */
  readonly #nextPoll = new NextLook(() => this.kick());
  #unlisten: Array<() => Promise<void>> = [];
  /** The claimer and the recorder when they run (each one statement at a time). */
  #claiming: Promise<void> | null = null;
  #recording: Promise<void> | null = null;
  /** A statement writing outcomes is in flight: the next batch waits for it. */
  #writing = false;
  /** Something asked to look for due rows (a notification, the poll, a freed slot with rows left behind). */
  #want = false;
  /** Failures not yet written, by destination: it gets no new claims until they are. */
  readonly #unwrittenFailures = new Map<number, number>();
  /**
   * A batch whose write failed is kept and written again (first in the next batch) from `at` on, until the
   * claims of its rows may lapse (`since` + the lease − the send timeout): a blip of the store neither re-sends what was delivered
   * nor lets a failing destination be claimed while its failures are missing from its streak.
   */
  #writeRetry: { since: number; at: number } | null = null;
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
  /** Parsed destination URLs by their text (null: not a URL); a changed URL is a new key. */
  readonly #targets = new Map<string, Target | null>();
  /** Claims, batches written (`both`: in one statement) and rows; for the bench and diagnostics. */
  readonly stats = { claims: 0, claimed: 0, claimMs: 0, records: 0, recorded: 0, recordMs: 0, both: 0 };

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
      // After the spread: a caller's explicit undefined means the default too.
      idlePollMs: opts.idlePollMs ?? opts.pollMs,
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
    if (process.env.POOLGATE_DEBUG_DELIVERER) setInterval(() => this.#o.log.warn({ stats: this.stats, inFlight: this.#inFlight.size, limits: [...this.#limits].map(([d, l]) => [d, l.limit, l.inFlight]) }, 'deliverer stats'), 2000).unref();
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
    if (this.#stopping) return;
    // Asked while a claim runs: the claimer runs again when it ends.
    if (this.#want && !this.#claiming) {
      this.#want = false;
      this.#claiming = this.#claimLoop()
        .catch((err: unknown) => {
          this.#o.log.warn({ err }, 'webhook deliverer: claiming due deliveries failed; retrying at the next poll');
          this.#nextPoll.in(this.#o.pollMs);
        })
        .finally(() => {
          this.#claiming = null;
          if (this.#want || this.#outcomes.length > 0) this.#schedule();
        });
    }
    // Outcomes the claim could not take with it (one is being written, or nothing is to be claimed): alone.
    if (this.#outcomes.length > 0 && !this.#writing && this.#mayWrite()) {
      this.#recording = this.#statement(0)
        .then(() => {})
        .finally(() => {
          this.#recording = null;
          if (this.#want || this.#outcomes.length > 0) this.#schedule();
        });
    }
  }

  /** Stops claiming, lets in-flight deliveries finish (each within the timeout), records them and closes connections. */
  async stop(): Promise<void> {
    this.#stopping = true;
    this.#nextPoll.close();
    if (this.#lingerTimer) clearTimeout(this.#lingerTimer);
    this.#lingerTimer = null;
    for (const u of this.#unlisten) await u().catch(() => {});
    this.#unlisten = [];
    await Promise.allSettled([...this.#inFlight]);
    await this.#claiming;
    await this.#recording;
    await this.#statement(0);
    await this.#agent.close().catch(() => {});
  }

  /** Claims due rows for the free slots and sends them; a full claim may have left due rows behind, so it claims again at once. */
  async #claimLoop(): Promise<void> {
    for (;;) {
      if (this.#stopping) return;
      const free = this.#o.concurrency - this.#inFlight.size;
      if (free <= 0) {
        this.#nextPoll.in(this.#o.pollMs);
        return;
      }
      // A read-only probe before a claim with nothing to write (a tenth of its cost): on the embedded store
      // each statement runs on the event loop that serves pool traffic, and most polls find nothing due. With
      // nothing due, the next poll is at the next due moment (or idlePollMs away), not pollMs.
      if (!this.#hint && (this.#writing || this.#outcomes.length === 0 || !this.#mayWrite())) {
        const next = await this.#nextDueInMs();
        if (next === null || next > 0) {
          this.#nextPoll.in(next === null ? this.#o.idlePollMs : sleepUntil(next, this.#o.idlePollMs));
          return;
        }
      }
      // Deliveries are going on: poll at the period until a poll finds nothing due.
      this.#nextPoll.in(this.#o.pollMs);
      const rows = await this.#statement(free);
      for (const row of rows) this.#launch(row);
      if (rows.length < free) {
        await this.#prune();
        return;
      }
      this.#hint = true;
    }
  }

  /**
   * How long until the earliest pending delivery to an active destination is due, on the store's clock (≤ 0:
   * now; null: none). A deactivated destination's rows wait for its re-enable, which notifies.
   */
  async #nextDueInMs(): Promise<number | null> {
    const { rows } = await this.#o.sql.query<{ next_in_ms: number | null }>(
      `SELECT EXTRACT(EPOCH FROM min(d.next_attempt_at) - now())::double precision * 1000 AS next_in_ms
         FROM webhook_endpoints w
         CROSS JOIN LATERAL (SELECT min(next_attempt_at) AS next_attempt_at FROM webhook_deliveries
                              WHERE webhook_endpoint_id = w.id AND status = 'pending') d
        WHERE w.disabled = false`,
    );
    return rows[0]?.next_in_ms ?? null;
  }

  /**
   * One statement (claim.ts): writes the gathered outcomes unless another statement is writing some (one at a
   * time: two writes could lock the same destinations' rows in opposite orders), and claims up to `n` due rows,
   * for each active destination as many as its room (adaptive limit minus what this process has in flight
   * there; the initial limit for one not sent to yet; none while it has a failure not yet written, this
   * batch's included). A failed write keeps the outcomes for a later statement (#writeRetry); a failed claim
   * throws.
   */
  async #statement(n: number): Promise<ClaimedRow[]> {
    // The batch is the gathered array itself only when this statement takes it: a claim with nothing to
    // write must not hold #outcomes, or the outcomes that arrive while it runs (and that another statement
    // writes) would count as written by it when it ends (a destination claimed again before its failures,
    // the 8th included, were in the store).
    let batch: Outcome[] = [];
    if (!this.#writing && this.#outcomes.length > 0 && this.#mayWrite()) {
      batch = this.#outcomes;
      this.#outcomes = [];
      this.#writing = true;
    }
    if (n === 0 && batch.length === 0) return [];
    const dests: number[] = [];
    const rooms: number[] = [];
    if (n > 0) {
      this.#hint = false;
      this.#backlog = true;
      for (const [dest, l] of this.#limits) {
        dests.push(dest);
        rooms.push(this.#unwrittenFailures.has(dest) ? 0 : l.room);
      }
    }
    const started = performance.now();
    let result: Awaited<ReturnType<typeof claimAndRecord>>;
    let kept = false;
    try {
      result = await claimAndRecord(
        this.#o.sql,
        { n, leaseMs: this.#o.leaseMs, dests, rooms, initialRoom: this.#o.initialPerDestination },
        batch.length > 0 ? { outcomes: batch, failuresBeforeDeactivation: FAILURES_BEFORE_DEACTIVATION } : null,
      );
    } catch (err) {
      if (batch.length > 0) kept = this.#keepUnwritten(batch, err);
      if (n > 0) throw err;
      return [];
    } finally {
      if (batch.length > 0) {
        this.#writing = false;
        if (!kept) this.#written(batch);
      }
    }
    if (batch.length > 0) this.#writeRetry = null;
    const ms = performance.now() - started;
    if (n > 0) {
      this.stats.claims++;
      this.stats.claimed += result.rows.length;
      this.stats.claimMs += ms;
      this.#backlog = result.rows.length >= n || this.#atRoom(result.rows, dests, rooms);
    }
    if (batch.length > 0) {
      this.stats.records++;
      this.stats.recorded += batch.length;
      this.stats.recordMs += ms;
    }
    if (n > 0 && batch.length > 0) this.stats.both++;
    for (const dest of result.deactivated) {
      this.#o.log.warn({ webhook: dest }, `webhook destination deactivated after ${FAILURES_BEFORE_DEACTIVATION} consecutive failed deliveries`);
    }
    return result.rows;
  }

  /** Whether a statement may write the gathered outcomes now (not while a failed write waits to be retried). */
  #mayWrite(): boolean {
    return this.#writeRetry === null || this.#stopping || performance.now() >= this.#writeRetry.at;
  }

  /**
   * A failed write: the batch goes back before what was gathered since (the streak sums outcomes in the order
   * they came back) and is written again a poll period later, its failures still unwritten. Once the claims of
   * its rows may have lapsed it is dropped: the rows are due again (another worker may be sending them) and come
   * back as after a crash (at-least-once); so is a batch whose write fails as the deliverer stops. Returns
   * whether the batch was kept.
   */
  #keepUnwritten(batch: Outcome[], err: unknown): boolean {
    const now = performance.now();
    const since = this.#writeRetry?.since ?? now;
    // A row's claim began at most a send timeout before its outcome came back: dropped before any claim can lapse.
    if (this.#stopping || now - since >= this.#o.leaseMs - this.#o.timeoutMs) {
      this.#writeRetry = null;
      this.#o.log.error({ err, deliveries: batch.length }, 'webhook delivery: recording the attempts failed (the deliverer is stopping, or their claims have lapsed); they will be sent again');
      return false;
    }
    this.#outcomes = batch.concat(this.#outcomes);
    this.#writeRetry = { since, at: now + this.#o.pollMs };
    // A timer may fire a millisecond before performance.now() reaches `at`.
    this.#nextPoll.in(this.#o.pollMs + 1);
    this.#o.log.warn({ err, deliveries: batch.length, retryMs: this.#o.pollMs }, 'webhook delivery: recording the attempts failed; writing them again');
    return true;
  }

  /** A batch's failures are written (or dropped): their destinations may claim again, at the next run. */
  #written(batch: readonly Outcome[]): void {
    let failed = false;
    for (const o of batch) {
      if (o.ok) continue;
      failed = true;
      const left = (this.#unwrittenFailures.get(o.dest) ?? 1) - 1;
      if (left <= 0) this.#unwrittenFailures.delete(o.dest);
      else this.#unwrittenFailures.set(o.dest, left);
    }
    if (failed) {
      this.#hint = true;
      this.#want = true;
    }
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

  #target(text: string): Target | null {
    let t = this.#targets.get(text);
    if (t === undefined) {
      try {
        const u = new URL(text);
        t = { hostname: u.hostname, origin: u.origin, path: `${u.pathname}${u.search}` };
      } catch {
        t = null;
      }
      if (this.#targets.size > 10_000) this.#targets.clear();
      this.#targets.set(text, t);
    }
    return t;
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
    const url = this.#target(row.url);
    if (!url) return { ok: false, status: null, error: 'invalid destination URL', latencyMs: 0 };
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

  async #sendSigned(row: ClaimedRow, url: Target, signal: AbortSignal, latency: () => number): Promise<AttemptOutcome> {
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
    // A flat name, value list: undici takes it without walking an object's keys.
    let headers: string[];
    try {
      const secret = this.#secret(row.signing_secret_enc);
      headers = pushDeliveryHeaders(['content-type', 'application/json', 'user-agent', 'poolgate-webhooks/1'], {
        signature: signDelivery(secret, timestamp, row.job_id, { sha256: row.body_sha256 }),
        timestamp,
        jobId: row.job_id,
        webhookId: row.webhook_endpoint_id,
        event: row.event_type,
      });
      if (row.credential_enc) {
        const cred = openCredential(this.#o.box, { secret_enc: row.credential_enc });
        if (cred.method === 'bearer_static') {
          const name = row.auth_header ?? 'authorization';
          setHeader(headers, name, name === 'authorization' ? `Bearer ${cred.token}` : cred.token);
        }
      }
    } catch (err) {
      return { ok: false, status: null, error: `cannot open the signing secret or credential: ${(err as Error).message}`, latencyMs: latency() };
    }

    try {
      const res = await this.#agent.request({
        origin: url.origin,
        path: url.path,
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

/** A destination URL as a send needs it. */
interface Target {
  hostname: string;
  origin: string;
  /** Path and query. */
  path: string;
}

/** Sets a header in a flat name, value list, replacing one of that name (names are lower-case). */
function setHeader(list: string[], name: string, value: string): void {
  for (let i = 0; i < list.length; i += 2) {
    if (list[i] === name) {
      list[i + 1] = value;
      return;
    }
  }
  list.push(name, value);
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
