// Soak: a 20,000-event burst to 4 destinations, the worker killed (SIGKILL) mid-burst and restarted;
// every event is delivered at least once to each destination (see test/helpers/webhook-crash.ts).
import t from 'tap';
import { needServer } from '../helpers/servers.js';
import { crashMidBurst } from '../helpers/webhook-crash.js';

const skip = await needServer('postgres');
if (skip) t.skip(skip);
else t.test('SIGKILL mid-burst, restart: every event delivered at least once', (t) => crashMidBurst(t, Number(process.env.SOAK_WEBHOOK_EVENTS ?? 20_000), 4, 600_000));
