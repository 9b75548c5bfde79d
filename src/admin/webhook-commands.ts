// `poolgate admin webhook …`: the dashboard's webhook actions — Re-enable a deactivated destination and
// read its delivery history. Spread into the command table of commands.ts (and only reached through it).
import { AdminUsageError, intOption, need, teamOf, type AdminDeps, type Command } from './command.js';
import type { TeamRow } from '../store/teams.js';
import { deliveryHistory, findWebhook, recoverDeliveries, reenableWebhook, replayDelivery, type WebhookRow } from '../store/webhooks.js';

const HISTORY_DEFAULT = 50;
const HISTORY_MAX = 1000;

async function destinationOf(deps: AdminDeps, v: Record<string, unknown>): Promise<{ team: TeamRow; webhook: WebhookRow }> {
  const team = await teamOf(deps, need(v, 'team'));
  const id = intOption(need(v, 'id'), 'id', 1, 2147483647);
  const webhook = await findWebhook(deps.sql, team.id, id);
  if (!webhook) throw new AdminUsageError(`webhook destination ${id} not found in team ${team.slug}`);
  return { team, webhook };
}

export const webhookCommands: Record<string, Command> = {
  'webhook enable': {
    usage: 'admin webhook enable --team TEAM --id WEBHOOK_ID   (Re-enable: active again, failure streak reset)',
    options: { team: { type: 'string' }, id: { type: 'string' } },
    async run(v, deps) {
      const { team, webhook } = await destinationOf(deps, v);
      // Tells the change feed at commit: the data plane and the deliverer resume at once.
      const row = (await reenableWebhook(deps.sql, team.id, webhook.id))!;
      return {
        webhook: { id: row.id, name: row.name, url: row.url, disabled: row.disabled, consecutive_failures: row.consecutive_failures, pool_ids: row.pool_ids },
        was_disabled: webhook.disabled,
      };
    },
  },

  'webhook history': {
    usage: `admin webhook history --team TEAM --id WEBHOOK_ID [--limit N]   (newest first; N default ${HISTORY_DEFAULT}, max ${HISTORY_MAX})`,
    options: { team: { type: 'string' }, id: { type: 'string' }, limit: { type: 'string' } },
    async run(v, deps) {
      const { webhook } = await destinationOf(deps, v);
      const limit = v.limit === undefined ? HISTORY_DEFAULT : intOption(need(v, 'limit'), 'limit', 1, HISTORY_MAX);
      return {
        webhook: { id: webhook.id, name: webhook.name, url: webhook.url, disabled: webhook.disabled, consecutive_failures: webhook.consecutive_failures },
        attempts: await deliveryHistory(deps.sql, webhook.id, limit),
      };
    },
  },

  'webhook replay': {
    usage: 'admin webhook replay --team TEAM --id WEBHOOK_ID --job JOB_ID   (send one delivery again now: same job id and body, signed with the current secret)',
    options: { team: { type: 'string' }, id: { type: 'string' }, job: { type: 'string' } },
    async run(v, deps) {
      const { webhook } = await destinationOf(deps, v);
      const job = need(v, 'job');
      if (!/^[A-Za-z0-9_-]{1,100}$/.test(job)) throw new AdminUsageError('--job must be a job id (letters, digits, _ and -)');
      if (webhook.disabled) throw new AdminUsageError(`webhook destination ${webhook.id} is deactivated; re-enable it first (admin webhook enable)`);
      const replayed = await replayDelivery(deps.sql, webhook.id, job);
      if (!replayed) throw new AdminUsageError(`no delivery of job ${job} to webhook destination ${webhook.id} (or it is past its retention)`);
      return { webhook_endpoint_id: webhook.id, replayed };
    },
  },

  'webhook recover': {
    usage: 'admin webhook recover --team TEAM --id WEBHOOK_ID --since ISO_TIME   (send again every delivery given up whose event came at or after the time)',
    options: { team: { type: 'string' }, id: { type: 'string' }, since: { type: 'string' } },
    async run(v, deps) {
      const { webhook } = await destinationOf(deps, v);
      const raw = need(v, 'since');
      const since = new Date(raw);
      if (!/^\d{4}-\d{2}-\d{2}/.test(raw) || Number.isNaN(since.getTime())) throw new AdminUsageError('--since must be an ISO 8601 time, e.g. 2026-11-25T09:00:00Z');
      if (webhook.disabled) throw new AdminUsageError(`webhook destination ${webhook.id} is deactivated; re-enable it first (admin webhook enable)`);
      return { webhook_endpoint_id: webhook.id, since: since.toISOString(), recovered: await recoverDeliveries(deps.sql, webhook.id, since) };
    },
  },
};
