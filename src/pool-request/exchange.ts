// One pool request as the stages see it, and the answer a stage gives to stop it.
import type { Admission, Permit } from '../governor/governor.js';
import type { KeyEntry, PoolEntry, Snapshot } from './snapshot.js';
import type { HttpCode, HttpStatusOf } from '../errors/catalogue.js';
import type { BodySource } from './codec.js';

/**
 * What the access log and metrics call the way a request ended: an error code from the catalogue
 * (src/errors/catalogue.ts), or one of the ways a request ends without an error answer.
 */
export type OutcomeName =
  | 'proxied'
  /** Turned into an async job: spilled to the store and answered 202. */
  | 'job_accepted'
  /** A lock API acquire that was granted a slot (the lock API's success, sampled like `proxied`). */
  | 'lease_granted'
  /** The origin broke off a response already under way (nothing more can be sent). */
  | 'upstream_aborted'
  | 'client_aborted'
  | HttpCode;

/** A stage's refusal: the status, the stable error code, and headers such as Retry-After. */
export interface Reply {
  status: number;
  error: HttpCode;
  message: string;
  headers?: ReadonlyArray<readonly [string, string]>;
}

/** A refusal; the catalogue types both the code and the statuses that code may be sent with. */
export const reply = <C extends HttpCode>(status: NoInfer<HttpStatusOf<C>>, error: C, message: string, headers?: Reply['headers']): Reply => ({
  status: status as number,
  error,
  message,
  headers,
});


export interface Exchange {
  /** Upper-case method as sent. */
  readonly method: string;
  /** Path as sent (without the query); the canonical path once a path-scoped key was judged on it (scope.ts). */
  path: string;
  /** Raw query string without `?`, or ''. */
  readonly query: string;
  /** Request headers, names lower-case; repeated headers joined with ", ". */
  readonly headers: Record<string, string>;
  readonly clientAddress: string;
  /** The snapshot the request started on: every stage reads the same one. */
  readonly snapshot: Snapshot;
  readonly startedAt: number;
  /** Set by route. */
  pool: PoolEntry | null;
  /** Set by authenticate; null when the pool admits without a key. */
  key: KeyEntry | null;
  /** The key came in Authorization (so that header is not forwarded). */
  keyInAuthorization: boolean;
  /** Set by admit. */
  admission: Admission | null;
  permit: Permit | null;
  /** The governor put it in its wait queue (Admission.queued), whatever the answer. */
  waited: boolean;
  queuedMs: number;
  /** Time from dispatch upstream to the end of the response, once known. */
  upstreamMs: number | null;
  /** Released and recorded (stage 7 ran). */
  settled: boolean;
  /**
   * Where the request body arrives, or null when it has none. Set by the listener; the policies stage
   * replaces it when it reads a signed body whole first (it then feeds the body on from its buffer).
   */
  body: BodySource | null;
  /** The policies stage's pending verdict (JWT, signed body, Redis nonces), or null when it decided at once. */
  verdict: Promise<Reply | null> | null;
  /** The queue wait the request asked for (ms), set by the wait stage. */
  waitMs: number;
}

/**
 * A new exchange: every listener (the proxy port's doors, the lock API, job polling) builds its exchanges here,
 * so they share one object shape (V8 keeps one hidden class for the stages' reads).
 */
export function newExchange(
  method: string,
  path: string,
  query: string,
  headers: Record<string, string>,
  clientAddress: string,
  snapshot: Snapshot,
): Exchange {
  return {
    method,
    path,
    query,
    headers,
    clientAddress,
    snapshot,
    startedAt: performance.now(),
    pool: null,
    key: null,
    keyInAuthorization: false,
    admission: null,
    permit: null,
    waited: false,
    queuedMs: 0,
    upstreamMs: null,
    settled: false,
    body: null,
    verdict: null,
    waitMs: 0,
  };
}

/**
 * One stage of a chain (docs/architecture.md): null lets the request go on to the next stage, a Reply stops
 * it (the chain answers and settles it). A stage is built once, with the chain, and is called synchronously;
 * what it learns it writes on the Exchange. Stages never throw to refuse.
 */
export type Stage = (ex: Exchange) => Reply | null;

/** The peer's address as the stages compare it: an IPv4 client on a dual-stack socket without its `::ffff:` prefix. */
export function peerAddress(address: string | undefined): string {
  if (address === undefined) return '';
  return address.startsWith('::ffff:') ? address.slice(7) : address;
}

/** A header by a name that is not fixed in the code (a policy's configured header): own properties only. */
export function headerValue(headers: Readonly<Record<string, string>>, name: string): string | undefined {
  return Object.hasOwn(headers, name) ? headers[name] : undefined;
}
