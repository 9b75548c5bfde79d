// The Prometheus scrape endpoint: GET /metrics on its own port, nothing else.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';

export interface MetricsServer {
  readonly port: number;
  readonly server: Server;
  close(): Promise<void>;
}

/** Serves `registry` at GET/HEAD /metrics in the Prometheus text format; 404 for any other path. */
export async function startMetricsServer(host: string, port: number, registry: Registry): Promise<MetricsServer> {
  const server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?', 1)[0];
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
