import t from 'tap';
import { startTestService } from './helpers/service.js';
const svc = await startTestService();
t.teardown(() => svc.close());
t.pass('up');
