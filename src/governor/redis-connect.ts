// A client for the configured Redis target (src/config/redis-target.ts): ioredis's own Sentinel and Cluster
// support does the discovery, the failover following and the slot routing; this only maps the config onto it.
import { performance } from 'node:perf_hooks';
import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis';
import type { RedisTarget } from '../config/redis-target.js';

export type RedisClient = Redis | Cluster;

/** How often a Cluster client re-reads the slot map by itself (ioredis's default is 5 s). */
const CLUSTER_SLOTS_REFRESH_MS = 1000;

/**
 * A client for `target` with `options` (per connection). `cluster` adds Cluster-wide options (sharded
 * subscribers). On a Cluster, `options.enableOfflineQueue` applies to the cluster as a whole.
 */
export function connectRedis(target: RedisTarget, options: RedisOptions = {}, cluster: Partial<ClusterOptions> = {}): RedisClient {
  switch (target.kind) {
    case 'single':
      return new Redis(target.url, options);
    case 'sentinel':
      return new Redis({
        ...options,
        sentinels: target.sentinels,
        name: target.name,
        username: target.username,
        password: target.password,
        sentinelPassword: target.sentinelPassword,
        db: target.db,
        ...(target.tls ? { tls: {}, sentinelTLS: {}, enableTLSForSentinelMode: true } : {}),
        // A primary demoted while our connection to it stays up answers writes with READONLY: reconnect, and
        // the sentinels name the new one. (ioredis's failoverDetector is not used: with it, a +switch-master
        // that arrived while the client was still retrying ended the client for good, in our failover tests.)
        reconnectOnError: (err: Error) => err.message.startsWith('READONLY'),
        // A sentinel that does not answer is skipped at once (the next one is asked).
        sentinelRetryStrategy: (n: number) => Math.min(100 * n, 1000),
      });
    case 'cluster': {
      const { enableOfflineQueue, lazyConnect, ...perNode } = options;
      return new Cluster(target.nodes, {
        redisOptions: { ...perNode, username: target.username, password: target.password, ...(target.tls ? { tls: {} } : {}) },
        enableOfflineQueue: enableOfflineQueue ?? true,
        lazyConnect: lazyConnect ?? false,
        slotsRefreshInterval: CLUSTER_SLOTS_REFRESH_MS,
        clusterRetryStrategy: options.retryStrategy ?? ((n: number) => Math.min(100 * n, 2000)),
        ...cluster,
      });
    }
  }
}

export function isCluster(c: RedisClient): c is Cluster {
  return c instanceof Cluster;
}

/** The longest close() waits for a client's connections to end. */
const END_WAIT_MS = 10_000;

/**
 * Ends a client for good: no socket and no timer of it may outlive close(). A Cluster's quit or disconnect
 * leaves behind what it started meanwhile (a reconnect, a slot refresh's connection, a sharded subscriber
 * being replaced); each node connection still open is dropped, and its end awaited (bounded).
 */
export async function endClient(c: RedisClient): Promise<void> {
  const ended = (r: { status: string }) => r.status === 'end';
  // Bounded by time, not by rounds: on a loaded machine a node connection's end took longer than 40 rounds of
  // 25 ms (CI once saw close() return with four sockets still open, gone a moment later).
  const until = performance.now() + END_WAIT_MS;
  for (let i = 0; performance.now() < until; i++) {
    if (isCluster(c)) {
      const nodes = c.nodes('all');
      // (A refresh that found no node left may leave the status at 'disconnecting': nothing is open then.)
      if (nodes.length === 0 && (ended(c) || (i > 0 && c.status === 'disconnecting'))) return endRefresh(c);
      for (const n of nodes) if (!ended(n)) n.disconnect();
      if (!ended(c) && c.status !== 'disconnecting') c.disconnect();
    } else {
      if (ended(c)) return;
      c.disconnect();
    }
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** The longest a slot refresh on its way can take: one CLUSTER SLOTS per node it tries (slotsRefreshTimeout, 1 s). */
const REFRESH_END_WAIT_MS = 10_000;

/**
 * A Cluster with no node connection left may still have a slot refresh on its way, on a connection of its
 * own (ioredis's "refresher"). Once it is answered, the periodic refresh that started it arms its next
 * round, and nothing stops it after disconnect() has run: a timer every slotsRefreshInterval for good, one
 * per client (the "two Timeouts" that held a Cluster test's process open once in CI). The refresh's end is
 * awaited (a callback asked for now runs after it; with no node left and none on its way, at once), then the
 * round it armed is cleared.
 */
async function endRefresh(c: Cluster): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await new Promise<void>((done) => {
    timer = setTimeout(done, REFRESH_END_WAIT_MS);
    timer.unref();
    c.refreshSlotsCache(() => done());
  });
  clearTimeout(timer);
  c.disconnect();
}
