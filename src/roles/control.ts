// The control role: the Control API (and the dashboard it serves) on controlPort.
import { buildControlApp, type ControlApp } from '../control/app.js';
import type { ControlContext, LiveSource } from '../control/context.js';
import { ownHosts } from '../security/targets.js';
import type { RoleContext, Running } from './role.js';

export interface ControlRole extends Running {
  readonly app: ControlApp;
}

/** What the Control API reads of the role context (a test builds the app from these without a service). */
export type ControlRoleContext = Pick<RoleContext, 'config' | 'sql' | 'box' | 'now' | 'log' | 'lookup' | 'health'>;

/**
 * Builds the Control API without binding it: startControl listens on it; a test calls it and answers
 * requests with fastify's inject(). `urls` and `own` are the public addresses, which startControl fills in
 * once the port is bound.
 */
export async function buildControl(rc: ControlRoleContext, live: { source: LiveSource | null }): Promise<{ app: ControlApp; urls: ControlContext['urls']; own: string[] }> {
  const { config } = rc;
  const base = config.baseUrl ?? '';
  const lockApi = config.lockApiUrl ?? '';
  const urls = { base, lockApi, dashboard: config.dashboardUrl ?? `${base}/dashboard` };
  const own = ownHosts(config, [base, lockApi]);
  const ctx: ControlContext = {
    config,
    sql: rc.sql,
    box: rc.box,
    now: rc.now,
    log: rc.log,
    urls,
    live,
    targets: { allowPrivate: config.allowPrivateTargets, ownHosts: own, lookup: rc.lookup },
    health: rc.health,
  };
  return { app: await buildControlApp(ctx), urls, own };
}

/**
 * Builds the Control API and binds it. `live` is the dashboard's live numbers, filled in by the data plane
 * role when it shares this process (it starts later).
 */
export async function startControl(rc: RoleContext, live: { source: LiveSource | null }): Promise<ControlRole> {
  const { config } = rc;
  const { app, urls, own } = await buildControl(rc, live);
  try {
    await app.listen({ host: config.host, port: config.controlPort });
  } catch (err) {
    await app.close().catch(() => {});
    throw err;
  }
  const addr = app.server.address();
  const port = typeof addr === 'object' && addr ? addr.port : config.controlPort;
  rc.ports.control = port;
  // Public addresses default to what we bound, once the port is known.
  const hostForUrl = config.host.includes(':') ? `[${config.host}]` : config.host;
  if (!config.baseUrl) urls.base = `http://${hostForUrl}:${port}`;
  if (!config.dashboardUrl) urls.dashboard = `${urls.base}/dashboard`;
  if (!config.lockApiUrl) urls.lockApi = `http://${hostForUrl}:${config.lockPort}`;
  own.splice(0, own.length, ...ownHosts(config, [urls.base, urls.lockApi]));
  return { app, stop: () => app.close() };
}
