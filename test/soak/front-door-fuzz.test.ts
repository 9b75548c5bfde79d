// Issue 15's full proofs: 10,000 mutations of valid requests on the proxy port, and 20,000 requests paced at
// 1,000/s over 64 keep-alive connections, every one answered (test/helpers/http-fuzz.ts).
import t from 'tap';
import { fuzzFrontDoor, pacedLoad, startFuzzBed, UWS_PIPELINING, type FuzzBed } from '../helpers/http-fuzz.js';
import { uwsLoads } from '../../src/http/uws/load.js';
// Both proxy parsers (proxyHttpParser uws and node).

t.setTimeout(1_200_000);
// The uWS door only where its native build loads (Node 20); on Node 24 poolgate refuses the option.
for (const parser of uwsLoads() ? (['uws', 'node'] as const) : (['node'] as const)) {
  t.test(`proxyHttpParser ${parser}`, async (t) => {
    const bed: FuzzBed = await startFuzzBed(parser);
    t.teardown(() => bed.close());
    await t.test('10,000 mutations: no crash, no slot held, nothing at the origin the proxy did not answer for', (t) => fuzzFrontDoor(t, bed, 10_000, 1515, parser === 'uws' ? UWS_PIPELINING : undefined));
    await t.test('a paced load of 20,000 at 1,000/s over 64 connections is answered in full', (t) => pacedLoad(t, bed, 20_000, 1000, 64));
  });
}
