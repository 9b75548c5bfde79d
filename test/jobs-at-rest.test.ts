// Issue 15 item 9: an async job's stored request holds the client's secrets (Cookie, Authorization for the
// origin, the body): they are sealed at rest with the master key like other secrets, and opened when the job
// is claimed to run. The raw row is read back from the store: no plaintext of them is in it.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { startTestApi, type TestApi } from './helpers/service.js';
import { claimJob, spillJob } from '../src/jobs/job-store.js';
import { SecretBox } from '../src/security/secret-box.js';

let svc: TestApi;
t.before(async () => {
  svc = await startTestApi();
});
t.teardown(() => svc?.close());

t.test('a spilled job keeps no plaintext header or body in its row; the runner gets them back whole', async (t) => {
  const { sql, box } = svc;
  const boot = await svc.bootstrap();
  const { rows: pools } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key)
     VALUES ($1, 'atrest', 'atrest', 'http', 'https://origin.example', 'origin.example', 1, true) RETURNING id`,
    [boot.team.id],
  );
  const poolId = pools[0]!.id;
  const headers = { cookie: 'session=cookie-secret-1234', authorization: 'Bearer origin-token-5678', 'content-type': 'application/json' };
  const body = Buffer.from('{"card":"4111-1111-1111-1111"}');
  const id = `job_${randomBytes(8).toString('hex')}`;
  await spillJob(sql, box, { id, poolId, reason: 'requested', ttlMs: 60_000, request: { method: 'POST', path: '/pay', query: 'a=1', headers, clientAddress: '10.0.0.1', body } });

  const { rows } = await sql.query<{ headers: unknown; body: unknown }>('SELECT headers, body FROM jobs WHERE id = $1', [id]);
  const raw = JSON.stringify(rows[0]!.headers) + Buffer.from(rows[0]!.body as Uint8Array).toString('latin1');
  for (const secret of ['cookie-secret-1234', 'origin-token-5678', 'application/json', 'cookie', 'authorization', '4111-1111']) {
    t.notOk(raw.includes(secret), `the stored row does not hold ${JSON.stringify(secret)}`);
  }

  const claimed = await claimJob(sql, box, poolId, 30_000);
  t.same(claimed?.request.headers, headers, 'the runner gets the headers back');
  t.same(claimed?.request.body, body, 'and the body');

  const other = new SecretBox(randomBytes(32));
  t.throws(() => other.openBytes(Buffer.from(rows[0]!.body as Uint8Array)), 'another master key cannot open it');
});
