// Issue 15: a small version of the front-door fuzz (1,000 mutations per parser; 10,000 in
// test/soak/front-door-fuzz.test.ts) and of the paced-load count (every request sent is answered).
// See test/helpers/http-fuzz.ts.
import t from 'tap';
import { fuzzFrontDoor, pacedLoad, startFuzzBed, UWS_PIPELINING, type FuzzBed } from './helpers/http-fuzz.js';
import { uwsLoads } from '../src/http/uws/load.js';

// The uWS door only where its native build loads (Node 20); on Node 24 poolgate refuses the option.
for (const parser of uwsLoads() ? (['uws', 'node'] as const) : (['node'] as const)) {
  t.test(`proxyHttpParser ${parser}`, async (t) => {
    const bed: FuzzBed = await startFuzzBed(parser);
    t.teardown(() => bed.close());
    await t.test('1,000 mutations of valid requests: no crash, no slot held, nothing at the origin the proxy did not answer for', (t) =>
      fuzzFrontDoor(t, bed, 1000, 15, parser === 'uws' ? UWS_PIPELINING : undefined),
    );
    await t.test('a paced load is answered in full', (t) => pacedLoad(t, bed, 1000, 250, 16));
  });
}
