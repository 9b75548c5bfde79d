// What every Control API module is handed: config, store, secret box, target policy, clock.
import type { Config } from '../config/schema.js';
import type { Health } from '../health.js';
import type { Logger } from '../log.js';
import type { SecretBox } from '../security/secret-box.js';
import type { TargetPolicy } from '../security/targets.js';
import type { Queryable, Sql } from '../store/sql.js';
import type { PoolState } from '../governor/governor.js';
import type { LearnedState } from '../governor/outcome-learning.js';
import type { LastMinute } from '../metrics/live-counts.js';

/** What a data plane in this process knows of a pool right now (the dashboard's live numbers). */
export interface LiveSource {
  state(poolId: number): PoolState;
  lastMinute(poolId: number): LastMinute;
  /** The pool's adaptive limit and its last adjustments in this process; null when not known. */
  learned?(poolId: number): LearnedState | null;
}

export interface ControlContext {
  readonly config: Config;
  readonly sql: Sql;
  readonly box: SecretBox;
  readonly targets: TargetPolicy;
  readonly now: () => Date;
  readonly log: Logger;
  /** Public addresses (from config, or the bound ports when config leaves them null). */
  readonly urls: { base: string; lockApi: string; dashboard: string };
  /**
   * Projects one config change (`<kind>:<id>`) to the data plane inside the writing transaction, so a
   * failed projection rolls the write back. Absent: a pg_notify on CHANGE_CHANNEL through the transaction.
   */
  readonly project?: (tx: Queryable, change: string) => Promise<void>;
  /** The process's health, served without auth at /livez, /readyz and /healthz. */
  readonly health?: Health;
  /**
   * The data plane's live state, when it runs in this process (set once it has started); null in a
   * control-only process, whose live numbers then say `reporting: false`.
   */
  readonly live?: { source: LiveSource | null };
}

import type {
  FastifyBaseLogger,
  FastifyInstance,
  RawReplyDefaultExpression,
  RawRequestDefaultExpression,
  RawServerDefault,
} from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';

/** The Control API app as route modules see it: typed by the TypeBox schemas of each route. */
export type TypedApp = FastifyInstance<
  RawServerDefault,
  RawRequestDefaultExpression,
  RawReplyDefaultExpression,
  FastifyBaseLogger,
  TypeBoxTypeProvider
>;
