// nginx as the reverse-proxy reference: a config in a temp dir (keep-alive https upstream that trusts the
// origin's certificate, limit_conn as its concurrency cap), run in the foreground on a free loopback port.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { connect } from 'node:net';
import { join } from 'node:path';
import { freePort, pinned } from './child.mjs';


async function waitForPort(port, ms) {
  const until = Date.now() + ms;
  for (;;) {
    try {
      await fetch(`http://127.0.0.1:${port}/`, { signal: AbortSignal.timeout(1000) });
      return;
    } catch (err) {
      if (Date.now() > until) throw new Error(`nginx did not answer on ${port}: ${err.message}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/**
 * @param {{ originHost: string, originPort: number, caFile: string, tlsName: string, limitConn: number, workers?: number, pin?: string }} o
 *   workers: worker_processes (default auto: one per CPU); pin: a CPU list for `taskset -c` (master and workers)
 */
export async function startNginx(o) {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-nginx-'));
  const port = await freePort();
  const conf = join(dir, 'nginx.conf');
  writeFileSync(
    conf,
    `daemon off;
worker_processes ${o.workers ?? 'auto'};
user root root;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 4096; }
http {
  access_log ${dir}/access.log;
  client_body_temp_path ${dir}/client_body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  limit_conn_zone $server_name zone=pool:1m;
  upstream origin {
    server ${o.originHost}:${o.originPort};
    keepalive 128;
  }
  server {
    listen 127.0.0.1:${port};
    location / {
      limit_conn pool ${o.limitConn};
      proxy_pass https://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host ${o.originHost}:${o.originPort};
      proxy_ssl_trusted_certificate ${o.caFile};
      proxy_ssl_verify on;
      proxy_ssl_name ${o.tlsName};
      proxy_ssl_server_name on;
      proxy_ssl_session_reuse on;
    }
  }
}
`,
  );
  const child = spawn(...pinned(o.pin, 'nginx', ['-p', dir, '-c', conf]), { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (c) => (stderr += c));
  const exited = new Promise((resolve) => child.once('exit', resolve));
  try {
    await Promise.race([waitForPort(port, 10_000), exited.then((c) => Promise.reject(new Error(`nginx exited (${c}): ${stderr}`)))]);
  } catch (err) {
    child.kill('SIGTERM');
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  return {
    port,
    pid: child.pid,
    async stop() {
      // SIGQUIT: graceful shutdown of the master and its workers.
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGQUIT');
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * nginx as an https origin: every request answered 200 with one small fixed JSON body from its config (no file
 * read), keep-alive, on `host` and a free port. A C origin on the load generator's core leaves the proxy the
 * only bottleneck (as in /work/shared/devbench). Resolves to { port, pid, stop }.
 * @param {{ host: string, keyFile: string, certFile: string, workers?: number, pin?: string }} o
 */
export async function startNginxOrigin(o) {
  const dir = mkdtempSync(join(tmpdir(), 'poolgate-bench-nginx-origin-'));
  const port = await freePort();
  const conf = join(dir, 'nginx.conf');
  writeFileSync(
    conf,
    `daemon off;
worker_processes ${o.workers ?? 1};
user root root;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path ${dir}/client_body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  server {
    listen ${o.host}:${port} ssl;
    ssl_certificate ${o.certFile};
    ssl_certificate_key ${o.keyFile};
    location / {
      default_type application/json;
      return 200 '{"ok":true,"service":"origin","items":[1,2,3]}';
    }
  }
}
`,
  );
  const child = spawn(...pinned(o.pin, 'nginx', ['-p', dir, '-c', conf]), { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (c) => (stderr += c));
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const until = Date.now() + 10_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`nginx origin exited (${child.exitCode}): ${stderr}`);
    const open = await new Promise((resolve) => {
      const s = connect(port, o.host, () => { s.destroy(); resolve(true); });
      s.once('error', () => resolve(false));
    });
    if (open) break;
    if (Date.now() > until) {
      child.kill('SIGTERM');
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`nginx origin did not listen on ${o.host}:${port}: ${stderr}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    port,
    pid: child.pid,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGQUIT');
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
