// The probe address of a process without the dataplane role: its health paths (and an empty /metrics) on
// the metrics port, so every process of a split deployment has the same probe address. (With the dataplane
// role, its metrics server serves them beside the pool metrics.)
import { Registry } from 'prom-client';
import { startMetricsServer } from '../metrics/server.js';
import { closes, type RoleContext, type Running } from './role.js';

export async function startHealthServer(rc: RoleContext): Promise<Running> {
  const server = await startMetricsServer(rc.config.host, rc.config.metricsPort, new Registry(), rc.health);
  rc.ports.metrics = server.port;
  return closes(server)!;
}
