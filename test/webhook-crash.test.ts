// Issue 18: a worker killed (SIGKILL, a real child process) in the middle of a burst of deliveries loses
// nothing: after a restart every event reaches each destination at least once. A small burst here; a large
// one in test/soak/webhook-crash.test.ts.
import t from 'tap';
import { needServer } from './helpers/servers.js';
import { crashMidBurst } from './helpers/webhook-crash.js';

const skip = await needServer('postgres');
if (skip) t.skip(skip);
else t.test('SIGKILL mid-burst, restart: every event delivered at least once', (t) => crashMidBurst(t, 300, 2, 60_000));
