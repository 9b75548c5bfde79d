// Issue 15's fuzz and paced-load proofs against the proxy port, shared by the default suite (small counts) and
// test/soak (10,000 mutations): mutations of valid requests → no crash, no slot held afterwards, and nothing
// reaches the origin that the proxy did not answer for; a paced load → every request sent is answered.
import type { Test } from 'tap';
import { Pool } from 'undici';
import { startTestService, type TestService } from './service.js';
import { startOrigin, type Origin } from './origin.js';
import { sendRaw } from './http-corpus.js';
import { CHANGE_CHANNEL } from '../../src/store/sql.js';

export interface FuzzBed {
  svc: TestService;
  origin: Origin;
  poolId: number;
  key: string;
  close(): Promise<void>;
}

export async function startFuzzBed(parser: 'uws' | 'node' = 'uws'): Promise<FuzzBed> {
  const origin = await startOrigin();
  const svc = await startTestService({ overrides: { originCaFile: origin.caFile, proxyHttpParser: parser } });
  const boot = await svc.bootstrap();
  const { rows } = await svc.service.sql.query<{ id: number }>(
    `INSERT INTO pools (team_id, name, subdomain, backend, origin, origin_host, max_concurrent, require_key, settings)
     VALUES ($1, 'fuzz', 'fuzz', 'http', $2, $3, 64, true, $4::jsonb) RETURNING id`,
    [boot.team.id, origin.url, new URL(origin.url).host, JSON.stringify({ readMethods: ['POST'], readPaths: { POST: ['/search'] } })],
  );
  await svc.service.sql.notify(CHANGE_CHANNEL, `pool:${rows[0]!.id}`);
  const r = await svc.api('POST', '/api/v1/pools/fuzz/keys', { token: boot.token, body: { access: 'read' } });
  await svc.service.dataplane!.snapshots.reload();
  return {
    svc,
    origin,
    poolId: rows[0]!.id,
    key: r.body.data.key,
    async close() {
      await svc.close();
      await origin.close();
    },
  };
}

/** A small deterministic PRNG (mulberry32): a failing seed can be replayed. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const PIECES = ['\r\n', '\n', '\r', '\0', ' ', ':', 'Content-Length: 3\r\n', 'Transfer-Encoding: chunked\r\n', 'Content-Length: 0\r\n', '%2f', '..', ';', '\\', 'HTTP/1.0', '\t', '0\r\n\r\n', 'Expect: 100-continue\r\n', 'X-HTTP-Method-Override: DELETE\r\n'];

function seeds(key: string, token: string): string[] {
  // Connection: close, so an answered case ends at once and only a held one costs the wait.
  const h = `Host: fuzz.pools.localhost\r\nX-Service-Key: ${key}\r\nConnection: close\r\n`;
  return [
    `GET /${token} HTTP/1.1\r\n${h}\r\n`,
    `POST /search/${token} HTTP/1.1\r\n${h}Content-Length: 3\r\n\r\nabc`,
    `POST /search/${token} HTTP/1.1\r\n${h}Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n`,
    `GET /${token}/a HTTP/1.1\r\n${h}\r\nGET /${token}/b HTTP/1.1\r\n${h}\r\n`,
  ];
}

/** One mutation of a valid request: 1–3 edits (flip, insert a piece or random byte, delete a run, duplicate a line). */
function mutate(rand: () => number, s: string): string {
  const edits = 1 + Math.floor(rand() * 3);
  for (let e = 0; e < edits; e++) {
    const at = Math.floor(rand() * (s.length + 1));
    const kind = Math.floor(rand() * 5);
    if (kind === 0) s = s.slice(0, at) + String.fromCharCode(Math.floor(rand() * 256)) + s.slice(at + 1);
    else if (kind === 1) s = s.slice(0, at) + PIECES[Math.floor(rand() * PIECES.length)] + s.slice(at);
    else if (kind === 2) s = s.slice(0, at) + s.slice(at + 1 + Math.floor(rand() * 8));
    else if (kind === 3) {
      const lines = s.split('\r\n');
      const i = Math.floor(rand() * lines.length);
      lines.splice(i, 0, lines[i]!);
      s = lines.join('\r\n');
    } else s = s.slice(0, at) + String.fromCharCode(Math.floor(rand() * 32)) + s.slice(at);
  }
  return s;
}

/**
 * `todo`: why the "nothing unanswered at the origin" assertion cannot hold yet. On uWS 20.30 a mutation that leaves
 * two pipelined requests has its first forwarded and then the connection closed unanswered (issue 15 item 2).
 */
export async function fuzzFrontDoor(t: Test, bed: FuzzBed, count: number, seed = 15, todo?: string): Promise<void> {
  const rand = prng(seed);
  const port = bed.svc.service.ports.proxy!;
  bed.origin.reset();
  const answered = new Map<string, boolean>();
  const statuses: Record<string, number> = {};
  const concurrency = 100;
  let next = 0;
  const worker = async () => {
    while (next < count) {
      const i = next++;
      const token = `f${i}x${Math.floor(rand() * 1e9).toString(36)}`;
      const base = seeds(bed.key, token);
      const bytes = mutate(rand, base[i % base.length]!);
      // 3 s of silence counts as no answer (as in the conformance test): on a loaded 2-core machine an answer that waits
      // for the origin (a pipelined request before a malformed one) has taken over 2 s.
      const r = await sendRaw(port, bytes, 3000);
      answered.set(token, r.statuses.some((s) => s >= 200));
      const key = r.statuses.length ? r.statuses.join('+') : r.closed ? 'closed' : 'held';
      statuses[key] = (statuses[key] ?? 0) + 1;
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  // Let anything forwarded late arrive, then check what the origin saw.
  await new Promise((r) => setTimeout(r, 500));
  let unanswered = 0;
  for (const req of bed.origin.requests) {
    for (const m of req.url.matchAll(/f\d+x[0-9a-z]+/g)) if (answered.has(m[0]) && !answered.get(m[0])) unanswered++;
  }
  const gotAnswer = [...answered.values()].filter(Boolean).length;
  t.comment(`answers: ${JSON.stringify(statuses)}`);
  t.equal(unanswered, 0, `${count} mutations (${gotAnswer} answered, ${bed.origin.count} requests at the origin): nothing reached the origin for a request the proxy did not answer`, todo ? { todo } : {});
  const dp = bed.svc.service.dataplane!;
  const until = Date.now() + 15_000;
  while ((dp.governor.state(bed.poolId).inFlight > 0 || dp.inFlight > 0) && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
  t.equal(dp.governor.state(bed.poolId).inFlight, 0, 'no slot held afterwards');
  t.equal(dp.inFlight, 0, 'no request left in flight in the data plane');
  // Generous: on a loaded machine the origin's TLS connections after a burst can take seconds.
  const ok = await sendRaw(port, seeds(bed.key, 'after')[0]!, 15_000);
  t.same(ok.statuses, [200], 'the proxy still answers a valid request');
}

/** `total` GETs paced at `rate`/s over `connections` keep-alive connections: every one is answered. */
export async function pacedLoad(t: Test, bed: FuzzBed, total: number, rate: number, connections: number): Promise<void> {
  const pool = new Pool(bed.svc.proxyUrl!, { connections });
  let answered = 0;
  let failed = 0;
  const started = performance.now();
  const all: Promise<void>[] = [];
  for (let i = 0; i < total; i++) {
    const due = started + (i * 1000) / rate;
    const wait = due - performance.now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    all.push(
      pool
        .request({ path: `/paced/${i}`, method: 'GET', headers: { host: 'fuzz.pools.localhost', 'x-service-key': bed.key } })
        .then(async (res) => {
          await res.body.dump();
          if (res.statusCode === 200) answered++;
          else failed++;
        })
        .catch(() => {
          failed++;
        }),
    );
  }
  // The 30 s bound is cleared when every answer is in: a pending timer would hold the test process open.
  let bound: NodeJS.Timeout | undefined;
  await Promise.race([Promise.all(all), new Promise((r) => (bound = setTimeout(r, 30_000)))]);
  clearTimeout(bound);
  await pool.close();
  t.equal(answered, total, `paced ${total} at ${rate}/s over ${connections} connections: every request answered 200 (${failed} not)`);
}

export const UWS_PIPELINING = 'uWS 20.30 forwards the first of two pipelined requests, then closes the connection unanswered (issue 15 item 2)';
