// The worker role's webhook deliverer: sends the outbox (job events, pool events) to the receivers.
import { ownHosts } from '../security/targets.js';
import { Deliverer } from '../webhooks/deliverer.js';
import { closeEnvelopeWorkers } from '../webhooks/envelope-body.js';
import type { RoleContext, Running } from './role.js';

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
