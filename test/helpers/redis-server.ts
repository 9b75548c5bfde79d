// A private redis-server (no persistence) on a free loopback port, for tests that stop and restart Redis.
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';

function bindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

// Ports for the servers a test starts itself (and may kill and start again on the same port) come from below
// the kernel's ephemeral range (32768–60999): a port from listen(0) is one that any outgoing connection of the
// machine may take as its local port a moment later, and a redis-server started on it then fails to bind. A
// Cluster node also binds its bus at port + 10000, so ports stay under 22768 and the bus under 32768.
const LOW = 10_000;
const SPAN = 12_768;

/** A loopback port below the ephemeral range that is free now (and, with `bus`, port + 10000 as well). */
export async function freePort(opts: { bus?: boolean } = {}): Promise<number> {
  for (let i = 0; i < 200; i++) {
    const port = LOW + Math.floor(Math.random() * SPAN);
    if ((await bindable(port)) && (!opts.bus || (await bindable(port + 10_000)))) return port;
  }
  throw new Error('no free loopback port below the ephemeral range');
}

/** Starts redis-server on `port` and resolves once it answers PING; the caller kills it. */
export async function startRedisServer(port: number): Promise<ChildProcess> {
  const proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  for (let i = 0; i < 100; i++) {
    const probe = new Redis({ port, lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 });
    probe.on('error', () => {});
    try {
      await probe.connect();
      await probe.ping();
      probe.disconnect();
      return proc;
    } catch {
      probe.disconnect();
      await sleep(50);
    }
  }
  proc.kill('SIGKILL');
  throw new Error('redis-server did not start');
}
