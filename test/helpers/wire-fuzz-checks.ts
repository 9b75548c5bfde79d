// What both wire-listener fuzz tests share: the fuzz pool made through the Control API, the checks every
// fuzz run must pass, and the after-run checks that nothing is held.
import type { Test } from 'tap';
import { startTestService, type TestService } from './service.js';
import type { FuzzReport } from './wire-fuzz.js';
import { soak } from './soak.js';

/** 10,000 frames in the soak run (test/soak/), 1,500 in the default suite. */
export const FUZZ_FRAMES = soak(10_000, 1_500);
/** How long the server may take to close after the client's FIN, or to answer a probe. */
export const FUZZ_CLOSE_MS = 15_000;

/**
 * poolgate in-process (a crash fails the test) with one database pool given `role`: max_concurrent 8 and
 * adaptive off, so no client queues behind a limit the fuzz's errors shrank; a key minted.
 */
export async function fuzzPool(t: Test, db: { port: number; name: string; username: string; password: string }) {
  const svc: TestService = await startTestService({ overrides: { dbAllowInsecure: true, accessLogFile: '/dev/null' } });
  t.teardown(() => svc.close());
  const boot = await svc.bootstrap();
  const call = async (method: 'POST' | 'PUT' | 'PATCH', path: string, body: unknown, want: number) => {
    const res = await svc.api(method, path, { token: boot.token, body });
    if (res.status !== want) throw new Error(`${method} ${path} → ${res.status} ${JSON.stringify(res.body)}`);
    return res.body.data;
  };
  const created = await call('POST', '/api/v1/pools/database', { db_host: 'localhost', db_port: db.port, db_name: db.name }, 201);
  const sub: string = created.subdomain;
  await call('PUT', `/api/v1/pools/${sub}/credential`, { method: 'postgres_role', username: db.username, password: db.password }, 200);
  await call('PATCH', `/api/v1/pools/${sub}/settings`, { max_concurrent: 8, settings: { adaptive: false } }, 200);
  const key: string = (await call('POST', `/api/v1/pools/${sub}/keys`, { label: 'fuzz' }, 201)).key;
  const dp = svc.service.dataplane!;
  await dp.snapshots.reload();
  return { svc, dp, sub, poolId: created.id as number, key };
}

/** Reads `read()` until `done` holds (closing sockets and rollbacks finish asynchronously), at most ~10 s. */
export async function settled<T>(read: () => T | Promise<T>, done: (v: T) => boolean): Promise<T> {
  let v = await read();
  for (let i = 0; i < 100 && !done(v); i++) {
    await new Promise((r) => setTimeout(r, 100));
    v = await read();
  }
  return v;
}

/**
 * The checks of the run itself: enough frames, every login worked, no hang, well-formed answers, probes answered.
 * `known` turns a check into a TODO naming an open listener bug (reported, not failed); FUZZ_STRICT=1 enforces it.
 */
export function checkRun(t: Test, report: FuzzReport, inserted: number, unit: string, known: { refused?: string } = {}): void {
  const todo = known.refused && !process.env.FUZZ_STRICT ? { todo: known.refused } : {};
  const brief = { ...report, hung: report.hung.length, malformed: report.malformed.length, unprobed: report.unprobed.length, refusedPreludes: report.refusedPreludes.length };
  t.comment(JSON.stringify(brief));
  t.ok(report.framesWritten >= FUZZ_FRAMES, `${report.framesWritten} ${unit} written over ${report.connections} connections`);
  t.same(report.refusedPreludes, [], 'every login with the key succeeded, and so did BEGIN + INSERT in each transaction scenario', todo);
  t.same(report.hung, [], 'every connection was closed by the server within the bound after the client finished');
  t.same(report.malformed, [], 'everything the server sent was well-formed protocol (errors with their code, SQLSTATE and message)');
  t.same(report.unprobed, [], `every connection of well-framed ${unit} still answered a query after its fuzz (or ended with an error)`);
  t.ok(inserted > 0, `${inserted} transactions inserted a row and then ended or vanished without COMMIT`);
  t.ok(report.vanished > 0, `${report.vanished} clients vanished without a goodbye`);
}

/** Nothing held after the run: no slot, no waiter, no client connection, no server connection linked to a client. */
export async function checkNothingHeld(
  t: Test,
  governor: () => { inFlight: number; queued: number },
  listener: () => { clients: number; linked: number },
): Promise<void> {
  const state = await settled(governor, (s) => s.inFlight === 0 && s.queued === 0);
  t.equal(state.inFlight, 0, 'the governor holds no slot for the pool');
  t.equal(state.queued, 0, 'and no waiter');
  const counts = await settled(listener, (c) => c.clients === 0 && c.linked === 0);
  t.equal(counts.clients, 0, 'the listener has no client connection left');
  t.equal(counts.linked, 0, 'and no server connection linked to a client (in a transaction)');
}
