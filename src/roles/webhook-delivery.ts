// The worker role's webhook deliverer: sends the outbox (job events, pool events) to the receivers.
import { ownHosts } from '../security/targets.js';
import { Deliverer } from '../webhooks/deliverer.js';
import { closeEnvelopeWorkers } from '../webhooks/envelope-body.js';
import type { RoleContext, Running } from './role.js';

/** The longest an idle deliverer on the embedded store sleeps between looks at the outbox. */
const IDLE_POLL_EMBEDDED_MS = 60_000;

export async function startWebhookDelivery(rc: RoleContext): Promise<Running> {
  const { config } = rc;
  const deliverer = new Deliverer({
    sql: rc.sql,
    box: rc.box,
    log: rc.log,
    targets: {
      allowPrivate: config.allowPrivateTargets,
      ownHosts: ownHosts(config, [config.baseUrl ?? '', config.lockApiUrl ?? '']),
      lookup: rc.lookup,
    },
    caFile: config.webhookCaFile,
    retry: { baseMs: config.webhookRetryBaseMs, capMs: config.webhookRetryCapMs, maxAttempts: config.webhookMaxAttempts },
    leaseMs: config.webhookClaimLeaseMs,
    concurrency: config.webhookConcurrency,
    perDestination: Math.min(config.webhookDestinationConcurrency, config.webhookConcurrency),
    pollMs: Math.min(1000, config.webhookRetryBaseMs),
    // The embedded store is this process's alone: every enqueue and re-enable notifies it, and retries and claim
    // leases are known due moments, so an idle deliverer looks once a minute at most (no statement a second on
    // the event loop that serves pool traffic). A shared store keeps the poll: other workers' retries and lapsing
    // claims arrive unannounced.
    idlePollMs: config.databaseUrl ? undefined : IDLE_POLL_EMBEDDED_MS,
    retentionMs: config.webhookReplayRetentionHours * 3600 * 1000,
    time: rc.webhookTime,
  });
  await deliverer.start();
  return {
    // In-flight sends finish; then the threads that build large event bodies (at enqueue) end.
    stop: async () => {
      await deliverer.stop();
      await closeEnvelopeWorkers();
    },
  };
}
