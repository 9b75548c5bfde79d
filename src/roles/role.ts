// What every role of a process is given, and what it hands back: a running part that can be stopped.
// service.ts starts the roles and stops them in the one order written there.
import type { GovernorTime } from '../governor/clock.js';
import type { Config } from '../config/schema.js';
import type { Health } from '../health.js';
import type { Logger } from '../log.js';
import type { SecretBox } from '../security/secret-box.js';
import type { Lookup } from '../security/targets.js';
import type { Sql } from '../store/sql.js';
import type { RedisNode } from './redis.js';
import { redisTarget } from '../config/redis-target.js';

/** A started part of the process. stop() ends it, letting its in-flight work finish first. */
export interface Running {
  stop(): Promise<void>;
}

/** Where this process listens, filled in by each role as its listeners bind (the order is the order of the log). */
export interface Ports {
  control?: number;
  proxy?: number;
  lock?: number;
  metrics?: number;
  pg?: number;
  mysql?: number;
  /** Each pool listener thread's port, when dataplaneThreads is above 1 (all equal to proxy when shared). */
  proxyThreads?: number[];
}

/** The process's shared pieces, the same for every role. */
export interface RoleContext {
  readonly config: Config;
  readonly sql: Sql;
  readonly box: SecretBox;
  readonly log: Logger;
  readonly now: () => Date;
  /** Unix ms for per-request checks: Date.now itself unless a test fixes the time. */
  readonly clock: () => number;
  /** The in-memory governor's time and timers: the system's, unless a test drives them. */
  readonly governorTime: Readonly<GovernorTime>;
  /** The webhook deliverer's send timeout (clock and timers): the system's, unless a test drives them. */
  readonly webhookTime: Readonly<Pick<GovernorTime, 'now' | 'timers'>>;
  /** DNS resolution used by the target guard; tests pass one that maps names to fixed addresses. */
  readonly lookup: Lookup;
  readonly health: Health;
  readonly ports: Ports;
  /** Public address of the lock API, where jobs are polled (its port is known once it listens). */
  readonly lockApiUrl: () => string;
}

/**
 * Stops the given parts one after the other, in the order given; a part not started (null) is skipped and
 * a failing stop does not keep the next from running.
 */
export async function stopInOrder(parts: ReadonlyArray<Running | null>): Promise<void> {
  for (const part of parts) if (part) await part.stop().catch(() => {});
}

/** A part whose own method is close() (listeners, servers), as a Running; null stays null (not started). */
export function closes(part: { close(): Promise<void> } | null): Running | null {
  return part && { stop: () => part.close() };
}

/** The node's Redis side (redis.ts) when a Redis is configured, imported only then; null without Redis. */
export async function redisSide(config: Config, log: Logger): Promise<RedisNode | null> {
  const target = redisTarget(config);
  if (target === null) return null;
  const { startRedisNode } = await import('./redis.js');
  return startRedisNode(target, config, log);
}
