// The data plane on the PostgreSQL store: the snapshot loads over pg and follows real LISTEN/NOTIFY,
// so a key minted and revoked through the Control API takes effect within one second.
import t from 'tap';
import { Pool } from 'undici';
import { startTestService } from './helpers/service.js';
import { startOrigin } from './helpers/origin.js';
import { needServer } from './helpers/servers.js';

t.test('mint and revoke through the Control API take effect within 1 s on PostgreSQL', async (t) => {
  const skip = await needServer('postgres');
  if (skip) return t.skip(skip);
  const origin = await startOrigin();
  t.teardown(() => origin.close());
  const svc = await startTestService({ engine: 'postgres', overrides: { originCaFile: origin.caFile, accessLogSample: 0, accessLogFile: '/dev/null' } });
  t.teardown(() => svc.close());
  const boot = await svc.bootstrap();
  const created = await svc.api('POST', '/api/v1/pools', { token: boot.token, body: { origin: origin.url, name: 'pg-feed' } });
  t.equal(created.status, 201);
  const sub: string = created.body.data.subdomain;
  const proxy = new Pool(svc.proxyUrl!);
  t.teardown(() => proxy.close());
  const call = async (key: string) => {
    const res = await proxy.request({ path: '/', method: 'GET', headers: { host: `${sub}.pools.localhost`, 'x-service-key': key } });
    await res.body.dump();
    return res.statusCode;
  };
  const within = async (key: string, status: number) => {
    const start = performance.now();
    while (performance.now() - start < 3000) {
      if ((await call(key)) === status) return performance.now() - start;
      await new Promise((r) => setTimeout(r, 20));
    }
    return Infinity;
  };

  const minted = await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token: boot.token, body: { label: 'pg' } });
  t.equal(minted.status, 201);
  const key: string = minted.body.data.key;
  const admittedAfter = await within(key, 200);
  t.ok(admittedAfter < 1000, `admitted ${Math.round(admittedAfter)} ms after mint`);
  t.equal(origin.count > 0, true, 'the request reached the origin');
  const revoked = await svc.api('DELETE', `/api/v1/pools/${sub}/keys/${minted.body.data.id}`, { token: boot.token });
  t.equal(revoked.status, 200);
  const refusedAfter = await within(key, 401);
  t.ok(refusedAfter < 1000, `refused ${Math.round(refusedAfter)} ms after revoke`);
});
