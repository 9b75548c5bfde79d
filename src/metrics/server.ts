// The Prometheus scrape endpoint: GET /metrics on its own port, and the process's health (/livez, /readyz, /healthz).
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import { HEALTH_PATHS, healthAnswer, type Health } from '../health.js';

export interface MetricsServer {
  readonly port: number;
  readonly server: Server;
  close(): Promise<void>;
}

/** Serves `registry` at GET/HEAD /metrics in the Prometheus text format, `health` at its paths; 404 for any other path. */
export async function startMetricsServer(host: string, port: number, registry: Registry, health?: Health): Promise<MetricsServer> {
  const server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?', 1)[0];
    if (health && (HEALTH_PATHS as readonly string[]).includes(path)) {
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain; charset=utf-8' }).end('method not allowed\n');
        return;
      }
      void healthAnswer(health, path).then(({ status, body }) => {
        res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' });
        res.end(req.method === 'HEAD' ? undefined : JSON.stringify(body));
      });
      return;
    }
    if (path !== '/metrics') {
      res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end('not found\n');
      return;
    }
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain; charset=utf-8' }).end('method not allowed\n');
      return;
    }
    registry.metrics().then(
      (body) => {
        res.writeHead(200, { 'content-type': registry.contentType, 'cache-control': 'no-store' });
        res.end(req.method === 'HEAD' ? undefined : body);
      },
      (err: unknown) => {
        // A failing collect callback must not take the scrape endpoint down; Prometheus sees the 500.
        res.writeHead(500, { 'content-type': 'text/plain; charset=utf-8' }).end(`collect failed: ${err instanceof Error ? err.message : String(err)}\n`);
      },
    );
  });
  // Scrapes are short requests; don't let idle keep-alive sockets hold shutdown.
  server.keepAliveTimeout = 5_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return {
    port: (server.address() as AddressInfo).port,
    server,
    close: () =>
      new Promise<void>((resolve, reject) => {
        server.close((err) => (err ? reject(err) : resolve()));
        server.closeIdleConnections();
      }),
  };
}
