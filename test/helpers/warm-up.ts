// Run once by scripts/test.mjs as tap starts the test processes: builds the run's store template, so that
// one process makes it while the first test processes load their modules, rather than one of them after that.
import { pgliteTemplate } from './pglite-template.js';

await pgliteTemplate();
