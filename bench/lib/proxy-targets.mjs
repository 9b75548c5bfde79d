// The proxy bench's origins and targets, shared by its modes (bench/proxy.mjs): the origin's certificate,
// poolgate set up through its Control API, the Node floor, and `poolgate demo-origin` as an origin.
import { execFileSync, spawn } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { request } from 'undici';
import { apiCaller, root, startPoolgate } from './poolgate.mjs';
import { pinned, startChild } from './child.mjs';

/** A self-signed certificate for `host` (an IP) and localhost, made now in `dir`. */
export function selfSignedCert(dir, host) {
  const keyFile = join(dir, 'key.pem');
  const certFile = join(dir, 'cert.pem');
  execFileSync(
    'openssl',
    ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', keyFile, '-out', certFile,
      '-days', '1', '-subj', `/CN=${host}`, '-addext', `subjectAltName=IP:${host},DNS:localhost`],
    { stdio: 'ignore' },
  );
  return { keyFile, certFile };
}

/** bench/lib/tls-origin.mjs on `host` with a certificate made now in `dir`: the child, its URL and the CA file to trust. */
export async function startTlsOrigin(dir, host, childOpts) {
  const { keyFile, certFile } = selfSignedCert(dir, host);
  const origin = await startChild(join(root, 'bench/lib/tls-origin.mjs'), [host, keyFile, certFile], childOpts);
  return { origin, certFile, originUrl: `https://${host}:${origin.port}` };
}

/**
 * poolgate with every role in one process on its embedded store: team bootstrapped with the admin CLI, then
 * through the Control API a pool, a key, and settings that keep it from queueing (max_concurrent raised,
 * adaptive concurrency off so the limit stays put). Otherwise the default configuration.
 * @param {{ bin?: string, threads?: number, pin?: string, wrap?: string[], maxConcurrent: number, accessLog?: boolean, nodeArgs?: string[], env?: Record<string, string> }} o
 */
export async function startPoolgateTarget(origin, caFile, dir, o) {
  const env = {
    POOLGATE_DATAPLANE_THREADS: String(o.threads ?? 1),
    POOLGATE_DATAPLANE_THREAD_PORTS: 'shared',
    POOLGATE_ORIGIN_CA_FILE: caFile,
    POOLGATE_ALLOW_PRIVATE_TARGETS: 'true',
    POOLGATE_LOG_LEVEL: 'warn',
    ...o.env,
  };
  if (o.accessLog !== false) env.POOLGATE_ACCESS_LOG_FILE = join(dir, `poolgate-access-${process.hrtime.bigint()}.log`);
  const nodeArgs = [...(o.nodeArgs ?? [])];
  if (process.env.BENCH_CPU_PROF) nodeArgs.push('--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF}`);
  // e.g. --perf-basic-prof, for `perf record` with JavaScript symbols.
  if (process.env.BENCH_NODE_ARGS) nodeArgs.push(...process.env.BENCH_NODE_ARGS.split(' ').filter(Boolean));
  const svc = await startPoolgate(env, { nodeArgs, bin: o.bin, pin: o.pin, wrap: o.wrap, startMs: o.wrap ? 600_000 : undefined });
  const stop = () => svc.stop();
  try {
    const boot = await svc.admin(['bootstrap', '--team', 'Bench', '--email', 'bench@bench.test', '--plan', 'business']);
    const call = apiCaller(svc.controlUrl, boot.token);
    const pool = await call('POST', '/api/v1/pools', { origin, name: 'bench-proxy' }, 201);
    const minted = await call('POST', `/api/v1/pools/${pool.subdomain}/keys`, { label: 'bench' }, 201);
    await call('PATCH', `/api/v1/pools/${pool.subdomain}/settings`, { max_concurrent: o.maxConcurrent, settings: { adaptive: false } }, 200);
    const url = `http://127.0.0.1:${svc.listening.proxy}/`;
    const urls = [...new Set(svc.listening.proxyThreads ?? [svc.listening.proxy])].map((port) => `http://127.0.0.1:${port}/`);
    const headers = { host: `${pool.subdomain}.pools.localhost`, 'x-service-key': minted.key };
    // Ready when the key works and the raised limit is in the governor (a 10-slot pool would queue at 50), in every thread.
    for (const u of urls) {
      for (let i = 0; ; i++) {
        const res = await get(u, headers);
        if (res.status === 200 && res.headers['x-service-effective-limit'] === String(o.maxConcurrent)) break;
        if (i > 50) throw new Error(`poolgate probe of ${headers.host} at ${u} → ${res.status} limit ${res.headers['x-service-effective-limit']} ${res.body}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    return { url, urls: urls.length > 1 ? urls : undefined, headers, pid: svc.pid, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/**
 * The Node floor (bench/lib/node-floor.mjs) in its own process, on whatever node runs the bench. `accessLogFile`:
 * the floor with the spec's per-request obligations (headers both ways, the X-Service-* headers, an access-log
 * line to that file).
 */
export async function startNodeFloor(originUrl, caFile, pin, wrap, accessLogFile) {
  const args = accessLogFile ? [originUrl, caFile, '--obligations', accessLogFile] : [originUrl, caFile];
  return startChild(join(root, 'bench/lib/node-floor.mjs'), args, { pin, wrap, startMs: wrap ? 300_000 : undefined });
}

/**
 * `poolgate demo-origin` (the product's own https echo origin, node:https) on a free port of 127.0.0.1, its
 * certificate made in `dir`. Resolves to { url, caFile, pid, stop }.
 */
export async function startDemoOrigin(dir, pin) {
  const child = spawn(...pinned(pin, process.execPath, [join(root, 'bin', 'poolgate.js'), 'demo-origin', '--port', '0', '--host', '127.0.0.1', '--dir', dir]), {
    cwd: root,
    env: { ...process.env, POOLGATE_DATA_DIR: dir },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (c) => (stderr = (stderr + c).slice(-4096)));
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const msg = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`poolgate demo-origin did not start within 30 s\n${stderr}`)), 30_000);
    createInterface({ input: child.stdout }).on('line', (line) => {
      try {
        const m = JSON.parse(line);
        if (m.event === 'listening') {
          clearTimeout(timer);
          resolve(m);
        }
      } catch {
        /* not our line */
      }
    });
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`poolgate demo-origin exited (${code}) before listening\n${stderr}`));
    });
  });
  return {
    url: msg.url.replace(/\/$/, ''),
    caFile: msg.caFile,
    pid: child.pid,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
    },
  };
}

/** One GET (undici: fetch would drop the Host header that names the pool). */
export async function get(url, headers) {
  const res = await request(url, { headers });
  return { status: res.statusCode, headers: res.headers, body: await res.body.text() };
}

/** A target answers 200 with the origin's body through it. */
export async function probe(t) {
  const res = await get(t.url, t.headers);
  if (res.status !== 200 || !res.body.includes('origin')) throw new Error(`${t.name}: probe answered ${res.status} ${res.body.slice(0, 200)}`);
}
