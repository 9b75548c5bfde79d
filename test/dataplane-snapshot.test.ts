// The data plane's snapshot follows key changes by point updates: a minted key admits and a revoked key
// is refused within a second, and a burst of mints costs no full reloads; other kinds still reload.
import t from 'tap';
import { Pool } from 'undici';
import { startTestService, type TestService } from './helpers/service.js';
import { startOrigin, type Origin } from './helpers/origin.js';
import { CHANGE_CHANNEL } from '../src/store/sql.js';
import { sleep, until } from './helpers/until.js';

let origin: Origin;
let svc: TestService;
let proxy: Pool;
let token: string;
let teamId: number;

t.before(async () => {
  origin = await startOrigin();
  // No periodic resync during the test: every full reload counted is one a notification caused.
  svc = await startTestService({ overrides: { originCaFile: origin.caFile, snapshotResyncMs: 3_600_000, accessLogFile: '/dev/null' } });
  const boot = await svc.bootstrap();
  token = boot.token;
  teamId = boot.team.id;
  proxy = new Pool(svc.proxyUrl!, { connections: 16 });
});
t.teardown(async () => {
  await proxy?.close();
  await svc?.close();
  await origin?.close();
});

const snapshots = () => svc.service.dataplane!.snapshots;

async function createPool(sub: string): Promise<number> {
  const sql = svc.service.sql;
  const { rows } = await sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, $2, $2, 'http', $3, $4, 50, true, '{}'::jsonb) RETURNING id`,
    [teamId, sub, origin.url, new URL(origin.url).host],
  );
  await sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  await snapshots().reload();
  return rows[0]!.id;
}

async function mint(sub: string): Promise<{ id: number; key: string }> {
  const res = await svc.api('POST', `/api/v1/pools/${sub}/keys`, { token, body: { label: 'snapshot-test' } });
  if (res.status !== 201) throw new Error(`mint → ${res.status} ${JSON.stringify(res.body)}`);
  return { id: res.body.data.id, key: res.body.data.key };
}

async function status(sub: string, key: string): Promise<number> {
  const res = await proxy.request({ path: '/', method: 'GET', headers: { host: `${sub}.pools.localhost`, 'x-service-key': key } });
  await res.body.dump();
  return res.statusCode;
}

/** Polls until the key gets `want`; resolves with the ms it took, or rejects after `limitMs`. */
async function answers(sub: string, key: string, want: number, limitMs = 1000): Promise<number> {
  const started = performance.now();
  for (;;) {
    const got = await status(sub, key);
    const ms = performance.now() - started;
    if (got === want) return ms;
    if (ms > limitMs) throw new Error(`key still answered ${got} (want ${want}) after ${Math.round(ms)} ms`);
    await sleep(10);
  }
}

/**
 * Sends `payload` on the change feed, then a key notification for no key as a marker, and resolves once the
 * marker has been handled (a point update, or a full load if the payload caused one). One LISTEN connection
 * delivers notifications in order and the source dispatches each as it arrives, so by then `payload` has been
 * handled too: a negative assertion after this waited for proof, not for a fixed time.
 */
async function notifySettled(payload: string): Promise<void> {
  const s = snapshots();
  const updates = s.keyUpdates;
  const loads = s.fullLoads;
  await svc.service.sql.notify(CHANGE_CHANNEL, payload);
  await svc.service.sql.notify(CHANGE_CHANNEL, 'key:999999999');
  await until(`the marker after ${payload}`, () => s.keyUpdates > updates || s.fullLoads > loads);
}

t.test('a minted key admits and a revoked key is refused within 1 s, without a full reload', async (t) => {
  await createPool('snap-one');
  const full = snapshots().fullLoads;
  const k = await mint('snap-one');
  t.ok((await answers('snap-one', k.key, 200)) < 1000, 'the new key is admitted within 1 s');
  const revoked = await svc.api('DELETE', `/api/v1/pools/snap-one/keys/${k.id}`, { token });
  t.ok(revoked.status === 200 || revoked.status === 204, `revoke answered ${revoked.status}`);
  t.ok((await answers('snap-one', k.key, 401)) < 1000, 'the revoked key is refused within 1 s');
  t.equal(snapshots().fullLoads, full, 'mint and revoke were point updates: no full reload');
  t.ok(snapshots().keysApplied >= 2, 'both changes went through the point update');
});

t.test('a burst of N mints causes no full reload and every key works within 1 s of its mint', async (t) => {
  await createPool('snap-burst');
  const full = snapshots().fullLoads;
  const updates = snapshots().keyUpdates;
  const N = 25;
  const keys = await Promise.all(Array.from({ length: N }, () => mint('snap-burst')));
  for (const k of keys) await answers('snap-burst', k.key, 200);
  t.equal(snapshots().fullLoads, full, `${N} mints: no full reload`);
  const batches = snapshots().keyUpdates - updates;
  t.ok(batches >= 1 && batches <= N, `${N} mints applied in ${batches} point updates (coalesced when they overlap)`);
  t.equal(snapshots().current.keys.size >= N, true, 'the snapshot holds the new keys');
});

t.test('a key of a deleted pool leaves, and a pool change still reloads the whole snapshot', async (t) => {
  const id = await createPool('snap-gone');
  const k = await mint('snap-gone');
  await answers('snap-gone', k.key, 200);
  const full = snapshots().fullLoads;
  await svc.service.sql.query(`UPDATE pools SET status = 'deleted' WHERE id = $1`, [id]);
  await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${id}`);
  await answers('snap-gone', k.key, 404);
  t.equal(snapshots().fullLoads, full + 1, 'a pool notification is one full reload');
  // A key notification for a key whose pool is gone drops it (here: already gone) without a reload.
  await notifySettled(`key:${k.id}`);
  t.equal(snapshots().fullLoads, full + 1, 'a key notification never reloads');
  t.notOk([...snapshots().current.keys.values()].some((e) => e.id === k.id), 'the key is not in the snapshot');
});

t.test('notifications about rows the snapshot does not hold cost nothing; unknown kinds and webhook changes reload', async (t) => {
  const full = snapshots().fullLoads;
  await notifySettled('token:1');
  t.equal(snapshots().fullLoads, full, 'token changes do not reload');
  await svc.service.sql.notify(CHANGE_CHANNEL, 'something-new:7');
  await until('a full reload', () => snapshots().fullLoads > full);
  t.equal(snapshots().fullLoads, full + 1, 'a kind it does not know is a full reload (the safe side)');
  // A destination's deactivation or re-enable decides whether its pools are async: the snapshot holds that.
  await svc.service.sql.notify(CHANGE_CHANNEL, 'webhook:1');
  await until('a second full reload', () => snapshots().fullLoads > full + 1);
  t.equal(snapshots().fullLoads, full + 2, 'a webhook change is a full reload');
});
